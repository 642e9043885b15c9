"""The task sets of RACES's composition study (`tirl study races`), held out by composition.

RACES (papers/003, Tables 1-3, Figure 2) compares RL on environments one at a time with RL on
their compositions. To ask the same question of a tiny model this module fixes:

- the pool: integer -> integer environments, whose chains always type-check, with the shortest
  mapper code (a tiny model has to learn to write each one) and short instructions; the first
  `pool_size` of them train, the next `unseen` are never trained on;
- the held-out compositions (`HeldOut`): a sequence of two or more environments belongs to the
  test side by a hash of its names alone (a `share` of all sequences), so no training set (SFT
  or any arm) holds a composition the evaluation asks about, with any input; every sequence
  that contains an unseen environment is on the test side too. Unseen environments test
  generalization to new environments as well as new orders, which a tiny model cannot do at
  all (the study's default has none: its compositions are new orders of trained environments);
- the held-out atomic tasks: one pool environment on an input whose (environment, input) hash
  falls on the test side (an atomic task is its own composition, so only its inputs are held out).

`study_tasks` returns every set as `OperatorTask`s with `meta.split` set, ready for
`tirl.envs.dataset.write_tasks` and the `races` source's `split_by: meta`. Everything is a
function of the seed: the same settings give the same files.
"""

from __future__ import annotations

import hashlib
import json
import random
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

from tirl.envs.core import Chain, Environment, Environments
from tirl.envs.dataset import DEFAULT_MIXTURE
from tirl.envs.operators import OPERATORS, OperatorTask, make_task
from tirl.envs.registry import REGISTRY
from tirl.envs.search import SearchConfig, search
from tirl.envs.seeding import split_of, unit_hash

ARMS = ("individual", "races", "races_small", "seq2", "seq3", "seq4", "seq5", "curriculum")
EVAL_SIZES = (2, 3, 4, 5)


@dataclass(frozen=True)
class ArmSpec:
    """What one arm trains on: operator weights, chain sizes, and the environments it draws."""

    mixture: dict[str, float]
    sizes: tuple[int, int]
    small_pool: bool = False  # RACES-small: a fifth of the pool


ARM_SPECS = {
    "individual": ArmSpec({"sequential": 1.0}, (1, 1)),  # one environment: an atomic task
    "races": ArmSpec(dict(DEFAULT_MIXTURE), (2, 4)),
    "races_small": ArmSpec(dict(DEFAULT_MIXTURE), (2, 4), small_pool=True),
    **{f"seq{k}": ArmSpec({"sequential": 1.0}, (k, k)) for k in (2, 3, 4, 5)},
    # every size the others train on, drawn by the pass-rate curriculum (`rl.curriculum`)
    # rather than in file order: the easiest sizes first, longer chains as they saturate
    "curriculum": ArmSpec(dict(DEFAULT_MIXTURE), (1, 5)),
}
CURRICULUM_ARMS = ("curriculum",)


@dataclass(frozen=True)
class StudyPool:
    train: tuple[str, ...]  # the pool every arm but RACES-small draws from
    small: tuple[str, ...]  # RACES-small's fifth of it
    unseen: tuple[str, ...]  # never trained on; only inside held-out compositions


@dataclass
class StudyTasks:
    pool: StudyPool
    sft: list[list[OperatorTask]]  # one set per SFT stage
    arms: dict[tuple[str, int], list[OperatorTask]]  # (arm, seed) -> that seed's RL tasks
    atomic: list[OperatorTask]  # held-out atomic tasks
    compositions: list[OperatorTask]  # held-out compositions, sizes 2-5, every operator
    counts: dict[str, int] = field(default_factory=dict)


def choose_pool(pool_size: int, unseen: int, seed: int, max_instruction: int = 110) -> StudyPool:
    """The int -> int environments with the shortest code (ties by name) and an instruction of at
    most `max_instruction` characters: the first `pool_size + unseen`; which of them are unseen
    is drawn with `seed`, and RACES-small keeps a fifth of the rest (at least two). Environments
    that leave most inputs as they are are skipped."""
    fitting = [
        e for e in REGISTRY
        if e.signature == ("int", "int") and len(e.instruction) <= max_instruction
        and _changes_its_input(e)
    ]  # fmt: skip
    fitting.sort(key=lambda e: (len(e.code), e.name))
    if len(fitting) < pool_size + unseen:
        raise ValueError(
            f"pool_size + unseen = {pool_size + unseen}, but only {len(fitting)} int -> int"
            f" environments have an instruction of at most {max_instruction} characters"
        )
    names = [e.name for e in fitting[: pool_size + unseen]]
    rng = random.Random(f"races-study/pool/{seed}")
    held = sorted(rng.sample(names, unseen))
    train = [n for n in names if n not in held]
    small = sorted(rng.sample(train, max(2, len(train) // 5)))
    return StudyPool(tuple(train), tuple(small), tuple(held))


def _changes_its_input(env: Environment, draws: int = 64) -> bool:
    """Whether the environment changes most level-1 inputs (|x| of a non-negative x does not:
    the search's quality control would drop nearly every chain through it)."""
    rng = random.Random(f"races-study/identity/{env.name}")
    xs = [env.sample(rng, 1) for _ in range(draws)]
    return sum(env.mapper(x) != x for x in xs) > draws // 2


@dataclass(frozen=True)
class HeldOut:
    """Which compositions the study holds out: those with an `unseen` environment, and a `share`
    of the others, by a hash of their names (ten environments make 84 sequences of two: the
    test split's usual eighth leaves too few for every operator's cell)."""

    unseen: tuple[str, ...] = ()
    share: float = 0.25

    def composition_side(self, names: tuple[str, ...]) -> str:
        """'test' for a held-out composition (two or more environments), else 'train'."""
        if set(names) & set(self.unseen):
            return "test"
        held = unit_hash("races-study/composition", json.dumps(list(names))) < self.share
        return "test" if held else "train"

    def side(self, traj: Chain) -> str:
        """A chain's side: an atomic task's by its (environment, input), as it is its own
        composition; a longer chain's by its composition."""
        if traj.size == 1:
            return split_of("races-study/atomic", json.dumps([traj.names(), repr(traj.x0)]))
        return self.composition_side(traj.names())


def _chains(
    registry: Environments, size: int, seed: int, tag: str, side: str, per_composite: int
) -> Iterator[Chain]:
    """The search's stream for one set (`tag`): its own seed, so sets draw different inputs. An
    atomic task is its own composition: only its inputs vary, as many as it has."""
    if size == 1:
        per_composite = 10**6
    config = SearchConfig(min_size=size, max_size=size, level=1, inputs_per_composite=per_composite)
    set_seed = int(hashlib.sha256(f"races-study/{seed}/{tag}".encode()).hexdigest()[:12], 16)
    return search(registry, set_seed, config, side)


def draw_tasks(
    registry: Environments,
    spec: ArmSpec,
    n: int,
    seed: int,
    tag: str,
    side: str,
    held_out: HeldOut,
    per_composite: int,
    arm: str | None = None,
) -> list[OperatorTask]:
    """`n` tasks on `side` (train or test): sizes uniform over `spec.sizes`, operators from the
    mixture, each task's chain searched over `registry` (RACES's randomized BFS with quality
    control). `tag` seeds the draw; `arm` (default: the tag) is written to each task's meta.
    Fewer than `n` only where the search runs out (a pool of two environments has few long
    chains); none at all raises."""
    rng = random.Random(f"races-study/{tag}/{seed}")
    operators, weights = list(spec.mixture), list(spec.mixture.values())
    lo, hi = spec.sizes
    streams = {s: _chains(registry, s, seed, tag, side, per_composite) for s in range(lo, hi + 1)}
    out: list[OperatorTask] = []
    misses = 0
    while len(out) < n and streams:
        size = rng.choice(sorted(streams))
        traj = next(streams[size], None)
        if traj is None:  # a small pool runs out of long chains: the other sizes go on
            del streams[size]
            continue
        if held_out.side(traj) != side:
            misses += 1
            if misses > 200 * n + 10_000:
                raise ValueError(f"{tag}: too few {side} chains of sizes {lo}-{hi}")
            continue
        task = make_task(rng.choices(operators, weights)[0], traj, registry, rng)
        out.append(replace(task, meta={"split": side, "size": traj.size, "arm": arm or tag}))
    if not out:
        raise ValueError(f"{tag}: the search found no {side} chain of sizes {lo}-{hi}")
    return out


def held_out_compositions(
    registry: Environments, per_cell: int, seed: int, held_out: HeldOut
) -> list[OperatorTask]:
    """`per_cell` held-out compositions for every (size 2-5, operator), each composition once."""
    rng = random.Random(f"races-study/heldout/{seed}")
    out: list[OperatorTask] = []
    used: set[tuple[str, ...]] = set()
    for size in EVAL_SIZES:
        stream = _chains(registry, size, seed, "heldout", "test", 1)
        for operator in OPERATORS:
            made = 0
            while made < per_cell:
                traj = next(stream, None)
                if traj is None:
                    held = sum(len(names) == size for names in used)
                    raise ValueError(
                        f"held-out: the search ran out of size-{size} compositions ({held} of"
                        f" size {size} held out; raise study.heldout_share or lower study.per_cell)"
                    )
                if traj.names() in used or held_out.composition_side(traj.names()) != "test":
                    continue
                used.add(traj.names())
                task = make_task(operator, traj, registry, rng)
                out.append(replace(task, meta={"split": "test", "size": size, "arm": "heldout"}))
                made += 1
    return out


def study_tasks(
    pool: StudyPool,
    seed: int,
    sft_items: int,
    arm_items: int,
    atomic_items: int,
    per_cell: int,
    sft_sizes: tuple[int, ...] = (2,),
    arm_seeds: tuple[int, ...] = (0,),
    per_composite: int = 8,
    heldout_share: float = HeldOut.share,
) -> StudyTasks:
    """Every task set of the study (see the module doc). SFT stage k's demonstrations mix atomic
    tasks and compositions of sizes 2..`sft_sizes[k]` over the whole pool, every operator, so
    that each arm starts from a model that knows every answer format. Each arm's RL tasks follow
    its `ARM_SPECS`, drawn once per seed in `arm_seeds`: seeds vary the tasks an arm trains on,
    while the pool, SFT and the held-out sets are the same for all (a function of `seed`)."""
    train_registry = REGISTRY.subset(list(pool.train))
    small_registry = REGISTRY.subset(list(pool.small))
    full_registry = REGISTRY.subset([*pool.train, *pool.unseen])
    held_out = HeldOut(pool.unseen, heldout_share)
    # SFT draws its compositions with many inputs each: a few hundred distinct chains would be
    # memorized in a few epochs, and the model must learn to copy any input, not these
    sft = [
        draw_tasks(
            train_registry, ArmSpec(dict(DEFAULT_MIXTURE), (1, size)), sft_items, seed,
            "sft" if k == 0 else f"sft{k}", "train", held_out, 10**6, arm="sft",
        )
        for k, size in enumerate(sft_sizes)
    ]  # fmt: skip
    arms = {}
    for name in ARMS:
        spec = ARM_SPECS[name]
        registry = small_registry if spec.small_pool else train_registry
        # a fifth of the pool has few compositions: inputs make the variety, as for atomic tasks
        many = 10**6 if spec.small_pool else per_composite
        for s in arm_seeds:
            tag = name if s == 0 else f"{name}/seed{s}"  # seed 0 keeps the single-seed sets
            arms[name, s] = draw_tasks(
                registry, spec, arm_items, seed, tag, "train", held_out, many, arm=name
            )
    atomic = draw_tasks(
        train_registry, ArmSpec({"sequential": 1.0}, (1, 1)), atomic_items, seed, "atomic",
        "test", held_out, 1,
    )  # fmt: skip
    compositions = held_out_compositions(full_registry, per_cell, seed, held_out)
    return StudyTasks(pool, sft, arms, atomic, compositions)


def composition_key(task: OperatorTask) -> tuple[str, ...]:
    return tuple(task.envs)


def item_key(task: OperatorTask) -> tuple:
    """An item: its environments and its input (what makes two tasks the same problem)."""
    return (tuple(task.envs), task.xs[0] if task.xs else None)
