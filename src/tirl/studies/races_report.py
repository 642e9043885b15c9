"""The analysis and report of `tirl study races` (the runner: `tirl.studies.races_study`).

Everything is read back from the study folder, never from the config: what each arm trained on
is counted from the task ids its updates logged (`train/tasks` in metrics.jsonl) looked up in the
arm's task file; held-out scores come from the evaluation samples.

Scores. An item's score is its operator reward in [0, 1] (RACES's reward: partial credit for
SEQUENTIAL and PARALLEL, `tirl.envs.operators`); accuracy (reward 1) is reported beside it. A
run's held-out score is the mean of its two held-out sets' means (atomic tasks, compositions),
as RACES averages its benchmarks. Uncertainty: a percentile bootstrap (2,000 resamples) that
resamples seeds and, within each set, items; a difference between two arms resamples both with
the same draws (paired: the same seeds and items).

The paper's four claims, each judged per variant (code, text-only) on the bootstrap CI of a
difference D (95 %):
1. composition generalizes better (Table 1): D = held-out(RACES) - held-out(individual);
   reproduced if the CI is above 0, not reproduced if below, inconclusive if it holds 0.
2. individual RL gets the higher training reward but not the higher held-out score (Figure 2):
   reproduced if the CI of train(individual) - train(RACES) (mean training reward over the last
   half of the steps) is above 0 and held-out(RACES) - held-out(individual) is >= 0; not
   reproduced if the training-reward CI is below 0 or the held-out CI is below 0; else
   inconclusive.
3. a fifth of the pool composed matches or beats the whole pool individually (Table 2):
   D = held-out(RACES-small) - held-out(individual); reproduced if the CI's lower end is >= -0.02
   (a match within 0.02), not reproduced if its upper end is below 0, else inconclusive (also
   when both arms score 0 on every item).
4. generalization is not monotonic in size, best at 4-5 (Table 3; the paper's drop at 6 is
   outside this sweep of 2-5): D = max(held-out(SEQ-4), held-out(SEQ-5)) - max(SEQ-2, SEQ-3);
   reproduced if the CI is above 0, not reproduced if below, else inconclusive. It can only
   be judged if the SFT start solves some held-out chain of size 3+ (SEQ-3/4/5 learn only from
   groups with a success): otherwise its verdict is "untestable (...)", and the report shows
   why (the start's composition reward and accuracy by size, the sweep arms' first-step
   training reward).

Besides the claims, every arm is compared with its own start (the "Every arm" table's vs-SFT
columns, results.json's `arms[...]["vs_sft"]`): D = held-out(arm) - held-out(SFT start), the
start scored from the SFT evaluation's samples on the same items (paired, the same draws; the
start is one model, the same for every seed), on both sets and on the compositions alone; "beats
its SFT start" if the CI is above 0, "below its SFT start" if below, else "within the noise".
An arm no better than where it started says RL taught it nothing, whatever the claims say.
Where none beats it, "What it would take" extrapolates each arm's measured compositions curve
linearly (`what_it_would_take`): the RL steps for its gain to reach the noise, and the
held-out compositions for its measured gain to clear its CI.

The curriculum arm (when it ran) gets its trajectory: each bucket's share of the draws and
pass rate per RL step and the frontier (plots/curriculum_<variant>.png), and per bucket its
share of all draws and last pass rate.
"""

from __future__ import annotations

import json
import math
import statistics
from collections import Counter, defaultdict
from pathlib import Path

import numpy as np

from tirl.envs.operators import OPERATORS
from tirl.files import json_text, read_jsonl, write_text
from tirl.protocol.segments import Trajectory
from tirl.report_kit import element, figure, figure_html, html_page, html_table, md_table, save_png
from tirl.studies.races_stats import (
    bootstrap_draws,
    ci,
    claim4_testability,
    heldout_score,
    nan_mean,
    verdict,
    versus_start,
    what_it_would_take,
)
from tirl.studies.races_tasks import ARM_SPECS, EVAL_SIZES

SETS = ("atomic", "compositions")
MATCH_MARGIN = 0.02  # claim 3: "matches" = within this much reward
ARM_TITLES = {
    "individual": "individual",
    "races": "RACES",
    "races_small": "RACES-small",
    "seq2": "SEQ-2",
    "seq3": "SEQ-3",
    "seq4": "SEQ-4",
    "seq5": "SEQ-5",
    "curriculum": "curriculum",
}
CLAIMS = (
    ("composition generalizes better", "RACES > individual on held-out tasks (Table 1)"),
    ("individual: higher train reward, not higher held-out",
     "individual RL's training reward is higher but its held-out score plateaus (Figure 2)"),
    ("a fifth of the pool composed matches all of it individually",
     "RACES on 50 base environments >= individual on 300 (Table 2)"),
    ("size: best at 4-5, not monotonic",
     "held-out score by SEQUENTIAL size 2..6 peaks at 4-5 and drops at 6 (Table 3)"),
)  # fmt: skip


# ---------------------------------------------------------------------- reading the folder


def _task_rows(path: Path) -> list[dict]:
    return list(read_jsonl(path))


def task_row(task_id: str) -> int:
    """Row of a `races/<split>/<k>` id in its split (every row of a study file has one split)."""
    return int(task_id.rsplit("/", 1)[1])


def trained_mixture(folder: Path, arm: str, variant: str, seed: int, rows: list[dict]) -> dict:
    """What an arm's updates trained on, counted from the logged task ids: tasks, operators,
    sizes and environments (a task counts once per update that used it)."""
    ops: Counter = Counter()
    sizes: Counter = Counter()
    envs: Counter = Counter()
    compositions: set[tuple[str, ...]] = set()
    updates = 0
    for record in read_jsonl(folder / f"seed{seed}" / arm / "metrics.jsonl"):
        if record.get("variant") != variant or record.get("phase") != "rl":
            continue
        ids = record.get("train/tasks") or []
        updates += bool(ids)
        for task_id in ids:
            row = rows[task_row(task_id)]
            ops[row["operator"]] += 1
            sizes[len(row["envs"])] += 1
            envs.update(row["envs"])
            compositions.add(tuple(row["envs"]))
    return {
        "updates": updates,
        "tasks": sum(ops.values()),
        "operators": dict(ops),
        "sizes": {str(k): v for k, v in sorted(sizes.items())},
        "envs": dict(envs),
        "compositions": sorted(compositions),
    }


def mixture_check(mix: dict, arm: str, pool: dict, heldout: set[tuple[str, ...]]) -> list[str]:
    """What is wrong with an arm's trained mixture against its spec ([] if nothing)."""
    spec = ARM_SPECS[arm]
    allowed = set(pool["small"] if spec.small_pool else pool["train"])
    problems = []
    if not mix["tasks"]:
        problems.append("trained on no task")
    bad_ops = set(mix["operators"]) - set(spec.mixture)
    if bad_ops:
        problems.append(f"operators outside the arm's mixture: {sorted(bad_ops)}")
    lo, hi = spec.sizes
    bad_sizes = [s for s in mix["sizes"] if not lo <= int(s) <= hi]
    if bad_sizes:
        problems.append(f"sizes outside {lo}-{hi}: {bad_sizes}")
    bad_envs = set(mix["envs"]) - allowed
    if bad_envs:
        problems.append(f"environments outside the arm's pool: {sorted(bad_envs)}")
    leaked = [c for c in mix["compositions"] if tuple(c) in heldout]
    if leaked:
        problems.append(f"{len(leaked)} held-out compositions trained on")
    return problems


def _item_scores(path: Path, n_items: int) -> tuple[np.ndarray, np.ndarray, int]:
    """Reward and correctness per item of an evaluation's samples (NaN where it failed)."""
    reward = np.full(n_items, np.nan)
    correct = np.full(n_items, np.nan)
    failed = 0
    for record in read_jsonl(path):
        traj = Trajectory.from_dict(record)  # also reads files from before typed scores
        if traj.score is None:
            failed += 1
            continue
        k = task_row(traj.task_id)
        reward[k] = traj.score.reward
        correct[k] = float(traj.score.correct)
    return reward, correct, failed


def _curve(folder: Path, variant: str, set_name: str, sft_value: float) -> list[tuple[int, float]]:
    """Held-out reward by RL step: the SFT model at 0, the rl_eval passes, the final one."""
    points = [(0, sft_value)]
    for record in read_jsonl(folder / "metrics.jsonl"):
        if record.get("variant") == variant and record.get("phase") == "rl_eval":
            points.append((record["step"], record[f"eval/{set_name}/reward"]))
    return points


def arm_task_file(manifest: dict, arm: str, seed: int) -> str:
    """An arm's RL task file for one seed; a study written before seeds drew their own tasks
    has one file per arm."""
    return manifest.get("arm_files", {}).get(arm, {}).get(str(seed), f"arm_{arm}.jsonl")


def load(folder: Path) -> dict:
    """Every number the report needs, read from the study folder. Of a study stopped midway,
    the arms that finished (`manifest["arms"]`), the others named in
    `manifest["unfinished_arms"]`."""
    folder = Path(folder)
    manifest = json.loads((folder / "tasks" / "manifest.json").read_text())
    finished = finished_arms(folder, manifest)
    unfinished = [arm for arm in manifest["arms"] if arm not in finished]
    manifest = {**manifest, "arms": finished, "unfinished_arms": unfinished}
    sft_eval = json.loads((folder / "sft" / "eval_progress.json").read_text())
    eval_rows = {s: _task_rows(folder / "tasks" / f"heldout_{s}.jsonl") for s in SETS}
    heldout_comps = {tuple(r["envs"]) for r in eval_rows["compositions"]}
    runs: dict = {}
    for variant in manifest["variants"]:
        for arm in manifest["arms"]:
            for seed in manifest["seeds"]:
                rows = _task_rows(folder / "tasks" / arm_task_file(manifest, arm, seed))
                run_dir = folder / f"seed{seed}" / arm
                progress = json.loads((run_dir / "eval_progress.json").read_text())
                records = _rl_records(run_dir, variant)
                steps = len(records)
                run: dict = {"sets": {}, "curves": {}}
                for s in SETS:
                    reward, correct, failed = _item_scores(
                        run_dir / "samples" / f"{variant}_rl_{s}.jsonl", len(eval_rows[s])
                    )
                    run["sets"][s] = {"reward": reward, "correct": correct, "failed": failed}
                    curve = _curve(run_dir, variant, s, sft_eval[variant]["sft"][s]["eval/reward"])
                    curve.append((steps, progress[variant]["rl"][s]["eval/reward"]))
                    run["curves"][s] = curve
                run["train_curve"] = [
                    (r["step"] + 1, r["train/reward_mean"]) for r in records
                    if "train/reward_mean" in r
                ]  # fmt: skip
                run["curriculum"] = curriculum_steps(records)
                run["mixture"] = trained_mixture(folder, arm, variant, seed, rows)
                run["mixture_problems"] = mixture_check(
                    run["mixture"], arm, manifest["pool"], heldout_comps
                )
                runs[(variant, arm, seed)] = run
    start = {
        variant: {s: dict(zip(("reward", "correct"), _item_scores(
            folder / "sft" / "samples" / f"{variant}_sft_{s}.jsonl", len(eval_rows[s]))))
            for s in SETS}
        for variant in manifest["variants"]
    }  # fmt: skip
    study_arms = [*manifest["arms"], *manifest["unfinished_arms"]]  # stopped arms count too
    first_rewards = {
        variant: {a: first_train_reward(folder, manifest, variant, a)
                  for a in ("seq3", "seq4", "seq5") if a in study_arms}
        for variant in manifest["variants"]
    }  # fmt: skip
    return {"manifest": manifest, "eval_rows": eval_rows, "runs": runs, "sft": sft_eval,
            "start": start, "first_train_reward": first_rewards}  # fmt: skip


def _arm_files(manifest: dict, arm: str) -> list[Path]:
    """What an arm's runs (every seed) leave in the study folder once finished."""
    files = []
    for seed in manifest["seeds"]:
        run_dir = Path(f"seed{seed}") / arm
        files += [run_dir / "eval_progress.json", run_dir / "metrics.jsonl"]
        files += [run_dir / "samples" / f"{v}_rl_{s}.jsonl" for v in manifest["variants"]
                  for s in SETS]  # fmt: skip
    return files


def finished_arms(folder: Path, manifest: dict) -> list[str]:
    """The study's arms whose runs all finished, in the study's order."""
    return [
        arm for arm in manifest["arms"]
        if all((folder / path).is_file() for path in _arm_files(manifest, arm))
    ]  # fmt: skip


def finished_problem(folder: Path) -> str | None:
    """What a folder lacks for a report (None if nothing): the SFT start's evaluation and at
    least one finished arm (a study stopped midway is reported on the arms that finished), so
    that `--report-only` on the wrong folder says so in one line."""
    folder = Path(folder)
    manifest_path = folder / "tasks" / "manifest.json"
    if not manifest_path.is_file():
        return "no tasks/manifest.json"
    try:
        manifest = json.loads(manifest_path.read_text())
        variants, arms, _ = manifest["variants"], manifest["arms"], manifest["seeds"]
    except (ValueError, KeyError, TypeError):
        return "tasks/manifest.json is not a study's manifest"
    wanted = [Path("sft") / "eval_progress.json"]
    wanted += [Path("sft") / "samples" / f"{v}_sft_{s}.jsonl" for v in variants for s in SETS]
    if not finished_arms(folder, manifest):
        wanted += _arm_files(manifest, arms[0])  # none finished: say what the first lacks
    missing = [str(path) for path in wanted if not (folder / path).is_file()]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        return f"no {missing[0]}{more}"
    return None


def curriculum_steps(records: list[dict]) -> list[dict]:
    """The curriculum's state per RL step ([] for an arm without one): each bucket's share of
    the draws since the last record, its pass rate once that counts, the frontier, and how many
    tasks were drawn (weighs the step's shares in the share of the whole run)."""
    steps = []
    for r in records:
        share, rate = {}, {}
        for key, value in r.items():
            if not key.startswith("curriculum/") or value is None or not math.isfinite(value):
                continue
            bucket, _, field = key.removeprefix("curriculum/").rpartition("/")
            if field == "share":
                share[bucket] = value
            elif field == "pass_rate":
                rate[bucket] = value
        if share:
            steps.append({
                "step": r["step"] + 1, "share": share, "pass_rate": rate,
                "frontier": r.get("curriculum/frontier"), "drawn": r.get("batch/tasks_started", 1),
            })  # fmt: skip
    return steps


def _rl_records(run_dir: Path, variant: str) -> list[dict]:
    return [
        r for r in read_jsonl(run_dir / "metrics.jsonl")
        if r.get("variant") == variant and r.get("phase") == "rl"
    ]  # fmt: skip


# ---------------------------------------------------------------------- statistics


def _stack(data: dict, variant: str, arm: str, s: str, key: str = "reward") -> np.ndarray:
    """[seeds, items] of one arm's final per-item scores on one held-out set."""
    seeds = data["manifest"]["seeds"]
    return np.stack([data["runs"][(variant, arm, seed)]["sets"][s][key] for seed in seeds])


def train_reward(data: dict, variant: str, arm: str, seed: int) -> float:
    """Mean training reward over the last half of the RL steps."""
    curve = data["runs"][(variant, arm, seed)]["train_curve"]
    tail = [v for _, v in curve[len(curve) // 2 :]]
    return statistics.fmean(tail) if tail else math.nan


UNTESTABLE = "untestable (the SFT start solves no chain of size 3+)"
# The arms each claim compares, in order (a study.arms without one cannot judge that claim).
CLAIM_ARMS = (
    ("races", "individual"),
    ("races", "individual"),
    ("races_small", "individual"),
    ("seq2", "seq3", "seq4", "seq5"),
)


def curriculum_summary(runs: list[dict]) -> dict[str, dict]:
    """Per bucket: its share of all the draws over the run (each step's shares weighed by how
    many tasks it drew) and its last pass rate, both a mean over the seeds that have them."""
    shares: dict[str, list[float]] = defaultdict(list)
    rates: dict[str, list[float]] = defaultdict(list)
    for run in runs:
        steps = run["curriculum"]
        drawn = sum(st["drawn"] for st in steps)
        buckets = {b for st in steps for b in st["share"]}
        for b in buckets:
            if drawn:
                shares[b].append(sum(st["share"].get(b, 0.0) * st["drawn"] for st in steps) / drawn)
            last = [st["pass_rate"][b] for st in steps if b in st["pass_rate"]]
            if last:
                rates[b].append(last[-1])
    return {
        b: {"share": statistics.fmean(shares[b]) if shares[b] else math.nan,
            "last_pass_rate": statistics.fmean(rates[b]) if rates[b] else math.nan}
        for b in sorted(set(shares) | set(rates), key=_bucket_order)
    }  # fmt: skip


def _bucket_order(name: str) -> tuple:
    """Buckets in difficulty order where their names are sizes ("2" before "10")."""
    return (0, int(name), "") if name.isdigit() else (1, 0, name)


def first_train_reward(folder: Path, manifest: dict, variant: str, arm: str) -> float:
    """An arm's training reward at its first RL step, the mean over the seeds that logged one
    (an arm stopped midway counts too: claim 4's testability needs only this step)."""
    values = []
    for seed in manifest["seeds"]:
        run_dir = folder / f"seed{seed}" / arm
        if (run_dir / "metrics.jsonl").is_file():
            rewards = [r["train/reward_mean"] for r in _rl_records(run_dir, variant)
                       if "train/reward_mean" in r]  # fmt: skip
            values += rewards[:1]
    return statistics.fmean(values) if values else math.nan


def analyse(data: dict, seed: int = 0) -> dict:
    """Scores with CIs per (variant, arm), breakdowns, and the four claims' verdicts."""
    manifest = data["manifest"]
    seeds = manifest["seeds"]
    arms = manifest["arms"]
    rng = np.random.default_rng(seed)
    n_items = {s: len(data["eval_rows"][s]) for s in SETS}
    draws = bootstrap_draws(rng, len(seeds), n_items)
    comp_rows = data["eval_rows"]["compositions"]
    unseen = set(manifest["pool"]["unseen"])
    groups = {
        **{f"size {k}": [i for i, r in enumerate(comp_rows) if len(r["envs"]) == k]
           for k in EVAL_SIZES},
        **{op: [i for i, r in enumerate(comp_rows) if r["operator"] == op] for op in OPERATORS},
    }  # fmt: skip
    if unseen:  # else every composition is of pool environments
        with_unseen = [bool(set(r["envs"]) & unseen) for r in comp_rows]
        groups["with an unseen env"] = [i for i, w in enumerate(with_unseen) if w]
        groups["pool envs only"] = [i for i, w in enumerate(with_unseen) if not w]
    out: dict = {"arms": {}, "claims": {}, "groups": {}, "claim4": {}, "curriculum": {},
                 "would_take": {}}  # fmt: skip
    for variant in manifest["variants"]:
        mats = {arm: {s: _stack(data, variant, arm, s) for s in SETS} for arm in arms}
        start = {s: data["start"][variant][s]["reward"] for s in SETS}
        boot = {arm: [heldout_score(mats[arm], d) for d in draws] for arm in arms}
        for arm in arms:
            trains = [train_reward(data, variant, arm, sd) for sd in seeds]
            row = {
                "heldout": heldout_score(mats[arm]),
                "heldout_ci": ci(boot[arm]),
                "train_reward": statistics.fmean(trains),
                "train_reward_ci": ci(_seed_boot(trains, draws)),
                **{f"{s}_reward": nan_mean(mats[arm][s]) for s in SETS},
                **{f"{s}_accuracy": nan_mean(_stack(data, variant, arm, s, "correct")) for s in SETS},
                "failed": sum(data["runs"][(variant, arm, sd)]["sets"][s]["failed"]
                              for sd in seeds for s in SETS),
                "vs_sft": versus_start(mats[arm], start, draws),
            }  # fmt: skip
            out["arms"][f"{variant}/{arm}"] = row
            curve = _mean_curve(
                [data["runs"][(variant, arm, sd)]["curves"]["compositions"] for sd in seeds]
            )
            vs = row["vs_sft"]
            out["would_take"][f"{variant}/{arm}"] = {
                "curve": curve,
                **what_it_would_take(curve, vs["compositions_D"], vs["compositions_ci"],
                                     n_items["compositions"]),
            }  # fmt: skip
            for name, idx in groups.items():
                comp = mats[arm]["compositions"][:, idx] if idx else np.full((1, 1), np.nan)
                n = comp.shape[1]
                vals = [nan_mean(comp, d[0], rng.integers(0, n, n)) for d in draws]
                out["groups"][f"{variant}/{arm}/{name}"] = {
                    "mean": nan_mean(comp),
                    "ci": ci(vals),
                    "items": len(idx),
                }
        out["claims"][variant] = _claims(data, variant, mats, boot, draws, seeds)
        out["claim4"][variant] = claim4_testability(
            data["start"][variant]["compositions"],
            [len(r["envs"]) for r in comp_rows],
            data["first_train_reward"][variant],
        )
        if not out["claim4"][variant]["testable"]:
            out["claims"][variant][3]["verdict"] = UNTESTABLE
        curriculum_runs = [data["runs"][(variant, a, sd)] for a in arms for sd in seeds
                           if data["runs"][(variant, a, sd)]["curriculum"]]  # fmt: skip
        if curriculum_runs:
            out["curriculum"][variant] = curriculum_summary(curriculum_runs)
    return out


def _seed_boot(values: list[float], draws: list[tuple]) -> list[float]:
    arr = np.array(values, dtype=float)
    return [float(np.nanmean(arr[d[0]])) for d in draws]


def _claims(data, variant, mats, boot, draws, seeds) -> list[dict]:
    def diff(a: str, b: str) -> tuple[float, tuple[float, float]]:
        if a not in mats or b not in mats:
            return math.nan, (math.nan, math.nan)
        return heldout_score(mats[a]) - heldout_score(mats[b]), ci(
            [x - y for x, y in zip(boot[a], boot[b])]
        )

    def blank(*arms_: str) -> bool:
        """Every item of every named arm scored 0: there is nothing to compare."""
        return all(a in mats and not any(np.nansum(m) for m in mats[a].values()) for a in arms_)

    claims = []
    d1, c1 = diff("races", "individual")
    claims.append({"D": d1, "ci": c1, "verdict": verdict(*c1)})

    if "races" in mats and "individual" in mats:
        gaps = [train_reward(data, variant, "individual", s) - train_reward(data, variant, "races", s)
                for s in seeds]  # fmt: skip
        t_ci = ci(_seed_boot(gaps, draws))
        t_gap = statistics.fmean(gaps)
    else:
        t_gap, t_ci = math.nan, (math.nan, math.nan)
    if t_ci[0] > 0 and d1 >= 0:
        v2 = "reproduced"
    elif t_ci[1] < 0 or c1[1] < 0:
        v2 = "not reproduced"
    else:
        v2 = "inconclusive"
    claims.append({"D": t_gap, "ci": t_ci, "heldout_D": d1, "heldout_ci": c1, "verdict": v2})

    d3, c3 = diff("races_small", "individual")
    if blank("races_small", "individual"):
        v3 = "inconclusive"  # 0 = 0 is no match worth the name
    elif math.isfinite(c3[0]) and c3[0] >= -MATCH_MARGIN:
        v3 = "reproduced"
    elif math.isfinite(c3[1]) and c3[1] < 0:
        v3 = "not reproduced"
    else:
        v3 = "inconclusive"
    claims.append({"D": d3, "ci": c3, "verdict": v3})

    # Over the sweep's arms that finished (a study stopped midway still gets its figure; the
    # verdict below names what is missing): longest chains' best - shortest chains' best.
    short = [a for a in ("seq2", "seq3") if a in mats]
    long_ = [a for a in ("seq4", "seq5") if a in mats]
    if short and long_:
        point = max(heldout_score(mats[a]) for a in long_) - max(
            heldout_score(mats[a]) for a in short
        )
        vals = [max(boot[a][i] for a in long_) - max(boot[a][i] for a in short)
                for i in range(len(draws))]  # fmt: skip
        c4 = ci(vals)
        claims.append({"D": point, "ci": c4, "verdict": verdict(*c4), "arms": short + long_})
    else:
        claims.append({"D": math.nan, "ci": (math.nan, math.nan), "verdict": "inconclusive"})
    unfinished = data["manifest"]["unfinished_arms"]
    for claim, needs in zip(claims, CLAIM_ARMS):  # say why, when an arm it compares is missing
        why = [
            f"{label}: {', '.join(names)}"
            for label, names in (
                ("not finished", [a for a in needs if a in unfinished]),
                ("not run", [a for a in needs if a not in mats and a not in unfinished]),
            )
            if names
        ]
        if why:
            claim["verdict"] = f"inconclusive ({'; '.join(why)})"
    return claims


# ---------------------------------------------------------------------- report


def _fmt(x: float, ci_: tuple[float, float] | None = None, sign: bool = False) -> str:
    if not math.isfinite(x):
        return "–"
    text = f"{x:+.3f}" if sign else f"{x:.3f}"
    if ci_ is not None and all(math.isfinite(v) for v in ci_):
        text += f" [{ci_[0]:+.3f}, {ci_[1]:+.3f}]" if sign else f" [{ci_[0]:.3f}, {ci_[1]:.3f}]"
    return text


def _plot_curves(data: dict, variant: str, path: Path) -> None:
    """RACES Figure 2's two panels: training reward and held-out score by RL step."""
    manifest = data["manifest"]
    fig = figure((11, 4))
    left, right = fig.subplots(1, 2)
    for arm in manifest["arms"]:
        runs = [data["runs"][(variant, arm, s)] for s in manifest["seeds"]]
        train = _mean_curve([r["train_curve"] for r in runs])
        left.plot([p[0] for p in train], [p[1] for p in train], label=ARM_TITLES[arm])
        held = _mean_curve(
            [[(a[0], (a[1] + b[1]) / 2) for a, b in zip(r["curves"]["atomic"],
                                                     r["curves"]["compositions"])]
             for r in runs]
        )  # fmt: skip
        right.plot([p[0] for p in held], [p[1] for p in held], marker="o", label=ARM_TITLES[arm])
    left.set(title=f"{variant}: training reward (mean over seeds)", xlabel="RL step",
             ylabel="mean reward of the batch")  # fmt: skip
    right.set(title=f"{variant}: held-out score", xlabel="RL step",
              ylabel="mean of held-out atomic and compositions")  # fmt: skip
    right.legend(fontsize=8)
    fig.tight_layout()
    save_png(fig, path, dpi=90)


def _mean_curve(curves: list[list[tuple[int, float]]]) -> list[tuple[int, float]]:
    by_step: dict[int, list[float]] = defaultdict(list)
    for curve in curves:
        for step, value in curve:
            if value is not None and math.isfinite(value):
                by_step[step].append(value)
    return [(s, statistics.fmean(v)) for s, v in sorted(by_step.items())]


def _plot_curriculum(data: dict, variant: str, path: Path) -> None:
    """The curriculum's trajectory: which buckets it drew from (top) and why (bottom: their
    pass rates, and the frontier that opens the next size)."""
    manifest = data["manifest"]
    runs = [data["runs"][(variant, a, s)] for a in manifest["arms"] for s in manifest["seeds"]]
    runs = [r for r in runs if r["curriculum"]]
    buckets = sorted({b for r in runs for st in r["curriculum"] for b in st["share"]},
                     key=_bucket_order)  # fmt: skip
    fig = figure((8, 6.5))
    top, bottom = fig.subplots(2, 1, sharex=True)
    shares = {b: _mean_curve([[(st["step"], st["share"].get(b, 0.0)) for st in r["curriculum"]]
                              for r in runs]) for b in buckets}  # fmt: skip
    steps = [p[0] for p in shares[buckets[0]]] if buckets else []
    if steps:
        top.stackplot(steps, *([v for _, v in shares[b]] for b in buckets), labels=buckets,
                      step="post")  # fmt: skip
        top.legend(title="bucket", fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
    top.set(title=f"{variant}: curriculum draws (mean over seeds)", ylabel="share of draws",
            ylim=(0, 1))  # fmt: skip
    for b in buckets:
        rate = _mean_curve([[(st["step"], st["pass_rate"][b]) for st in r["curriculum"]
                             if b in st["pass_rate"]] for r in runs])  # fmt: skip
        bottom.plot([p[0] for p in rate], [p[1] for p in rate], marker=".", label=b)
    bottom.set(title="pass rate per bucket, once it counts", xlabel="RL step",
               ylabel="group pass rate", ylim=(-0.05, 1.05))  # fmt: skip
    frontier = _mean_curve([[(st["step"], st["frontier"]) for st in r["curriculum"]
                             if st["frontier"] is not None] for r in runs])  # fmt: skip
    if frontier:
        level = bottom.twinx()
        level.step([p[0] for p in frontier], [p[1] for p in frontier], where="post",
                   color="black", linestyle="--", label="frontier")  # fmt: skip
        level.set(ylabel="frontier (open level)")
        level.legend(fontsize=8, loc="upper right")
    if buckets:
        bottom.legend(title="bucket", fontsize=8, loc="upper left", bbox_to_anchor=(1.12, 1))
    fig.tight_layout()
    save_png(fig, path, dpi=90)


def _plot_sizes(results: dict, variants: list[str], path: Path) -> None:
    fig = figure((5.5, 4))
    ax = fig.subplots()
    plotted = False
    for variant in variants:
        rows = [results["arms"].get(f"{variant}/seq{k}") for k in (2, 3, 4, 5)]
        if not all(rows):
            continue
        ys = [r["heldout"] for r in rows]
        lo = [r["heldout"] - r["heldout_ci"][0] for r in rows]
        hi = [r["heldout_ci"][1] - r["heldout"] for r in rows]
        ax.errorbar([2, 3, 4, 5], ys, yerr=[lo, hi], marker="o", capsize=3, label=variant)
        plotted = True
    ax.set(title="SEQUENTIAL size sweep", xlabel="training composition size",
           ylabel="held-out score (95% CI)")  # fmt: skip
    if plotted:
        ax.legend()
    else:
        ax.text(0.5, 0.5, "no size-sweep arms in this study", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    save_png(fig, path, dpi=90)


def report_blocks(data: dict, results: dict) -> list[tuple]:
    """The report as blocks: ("h", text), ("p", text), ("table", header, rows), ("img", file)."""
    m = data["manifest"]
    pool = m["pool"]
    blocks: list[tuple] = [("h", "RACES composition study")]
    blocks.append(("p", (
        f"Pool: {len(pool['train'])} integer -> integer environments with the shortest mapper"
        f" code ({', '.join(pool['train'])}). RACES-small: {', '.join(pool['small'])}. Never"
        f" trained on, only inside held-out compositions: {', '.join(pool['unseen']) or 'none'}."
        f" Seeds: {', '.join(map(str, m['seeds']))}; variants: {', '.join(m['variants'])}."
        " Every arm starts from the same SFT model of its variant and samples the same number of"
        " rollouts. Scores are operator rewards (partial credit for SEQUENTIAL / PARALLEL);"
        " the held-out score is the mean of the atomic and the composition set; [95% bootstrap"
        " CI over seeds and items].")))  # fmt: skip
    if m["unfinished_arms"]:
        blocks.append(("p", (
            "The study was stopped before these arms finished, so this report is on the others:"
            f" {', '.join(ARM_TITLES[a] for a in m['unfinished_arms'])} (`--resume` finishes"
            " them).")))  # fmt: skip
    blocks.append(("h2", "The four claims"))
    header = ["claim (paper)", *(f"{v}: D [CI]" for v in m["variants"]),
              *(f"{v}: verdict" for v in m["variants"])]  # fmt: skip
    rows = []
    for i, (short, paper) in enumerate(CLAIMS):
        cells = [f"{i + 1}. {short} — {paper}"]
        cells += [_fmt(results["claims"][v][i]["D"], results["claims"][v][i]["ci"], sign=True)
                  for v in m["variants"]]  # fmt: skip
        cells += [results["claims"][v][i]["verdict"] for v in m["variants"]]
        rows.append(cells)
    blocks.append(("table", header, rows))
    blocks.append(("p", (
        "D: claim 1 held-out(RACES) - held-out(individual); claim 2 training reward (last half"
        " of the steps) of individual - RACES; claim 3 held-out(RACES-small) - held-out"
        f"(individual), a match within {MATCH_MARGIN}; claim 4 max(SEQ-4, SEQ-5) - max(SEQ-2,"
        " SEQ-3) held-out, over those of the four that finished. The paper's size 6 is outside"
        " this sweep.")))  # fmt: skip
    blocks.append(("h2", "Every arm"))
    header = ["variant", "arm", "train reward (last half)", "held-out score", "atomic reward",
              "compositions reward", "atomic acc", "compositions acc", "failed samples",
              "held-out - SFT start [CI]", "compositions - SFT start [CI]",
              "vs SFT start", "compositions vs SFT start"]  # fmt: skip
    rows = []
    for key, r in results["arms"].items():
        variant, arm = key.split("/")
        vs = r["vs_sft"]
        rows.append([
            variant, ARM_TITLES[arm], _fmt(r["train_reward"], r["train_reward_ci"]),
            _fmt(r["heldout"], r["heldout_ci"]), _fmt(r["atomic_reward"]),
            _fmt(r["compositions_reward"]), _fmt(r["atomic_accuracy"]),
            _fmt(r["compositions_accuracy"]), str(r["failed"]),
            _fmt(vs["D"], vs["ci"], sign=True),
            _fmt(vs["compositions_D"], vs["compositions_ci"], sign=True), vs["verdict"],
            vs["compositions_verdict"],
        ])  # fmt: skip
    blocks.append(("table", header, rows))
    blocks.append(("p", (
        "vs SFT start: the arm's held-out score minus that of the SFT model every arm started"
        " from (scored on the same items, paired), on both sets and on the compositions alone;"
        " it beats its SFT start if the CI is above 0, is below it if the CI is below 0, else"
        " it is within the noise.")))  # fmt: skip
    blocks += _would_take_blocks(results)
    blocks += _claim4_blocks(results, m["variants"])
    for variant in m["variants"]:
        blocks.append(("h2", f"Held-out compositions by size and operator ({variant})"))
        first = m["arms"][0]
        prefix = f"{variant}/{first}/"  # the groups in the order analyse made them
        names = [key.removeprefix(prefix) for key in results["groups"] if key.startswith(prefix)]
        counts = {n: results["groups"][f"{variant}/{first}/{n}"]["items"] for n in names}
        header = ["arm", *(f"{n} (n={counts[n]})" for n in names)]
        rows = [[ARM_TITLES[arm], *(_fmt(results["groups"][f"{variant}/{arm}/{n}"]["mean"],
                                         results["groups"][f"{variant}/{arm}/{n}"]["ci"])
                                    for n in names)]
                for arm in m["arms"]]  # fmt: skip
        blocks.append(("table", header, rows))
        blocks.append(("img", f"plots/curves_{variant}.png"))
    blocks.append(("img", "plots/sizes.png"))
    blocks += _curriculum_blocks(results, m["variants"])
    blocks.append(("h2", "What each arm trained on (counted from the logged task ids)"))
    header = ["variant", "arm", "seed", "updates", "tasks", "operators", "sizes", "envs",
              "check"]  # fmt: skip
    rows = []
    for (variant, arm, seed), run in data["runs"].items():
        mix = run["mixture"]
        total = max(1, mix["tasks"])
        rows.append([
            variant, ARM_TITLES[arm], str(seed), str(mix["updates"]), str(mix["tasks"]),
            ", ".join(f"{k} {v / total:.0%}" for k, v in sorted(mix["operators"].items())),
            ", ".join(f"{k}: {v / total:.0%}" for k, v in mix["sizes"].items()),
            str(len(mix["envs"])),
            "; ".join(run["mixture_problems"]) or "as intended",
        ])  # fmt: skip
    blocks.append(("table", header, rows))
    return blocks


def _would_take_blocks(results: dict) -> list[tuple]:
    """Each arm's compositions curve and its linear extrapolation (`what_it_would_take`)."""
    header = ["variant", "arm", "compositions reward by RL step", "slope per RL step",
              "compositions - SFT start [CI]", "RL steps for a gain of the CI's half-width",
              "held-out compositions for this gain to clear its CI"]  # fmt: skip
    rows = []
    for key, w in results["would_take"].items():
        variant, arm = key.split("/")
        vs = results["arms"][key]["vs_sft"]
        rows.append([
            variant, ARM_TITLES[arm], ", ".join(f"{s}: {v:.3f}" for s, v in w["curve"]),
            _fmt(w["slope"], sign=True), _fmt(vs["compositions_D"], vs["compositions_ci"], sign=True),
            "–" if math.isnan(w["steps"]) else f"{w['steps']:,}",
            "–" if math.isnan(w["items"]) else f"{w['items']:,}",
        ])  # fmt: skip
    return [
        ("h2", "What it would take (held-out compositions, a linear extrapolation)"),
        ("table", header, rows),
        (
            "p",
            "Step 0 is the SFT start. The slope is a least-squares fit over the measured"
            " points; the RL steps are those at that slope for a gain as large as the CI's"
            " half-width (the noise of this many held-out items); the held-out compositions"
            " are those at which the measured gain would clear its CI (the half-width"
            " shrinking as 1/sqrt(items)). '–': no upward trend, or no gain. An estimate from"
            " few points, not a result.",
        ),
    ]


def _claim4_blocks(results: dict, variants: list[str]) -> list[tuple]:
    """Whether the size sweep could show anything: the SFT start by chain size, and where the
    SEQ-3/4/5 arms' training reward started."""
    blocks: list[tuple] = [("h2", "Is claim 4 testable? The SFT start by composition size")]
    header = ["variant", *(f"size {k} reward / acc" for k in EVAL_SIZES),
              *(f"{ARM_TITLES[a]} first-step train reward" for a in ("seq3", "seq4", "seq5"))]  # fmt: skip
    rows = []
    for variant in variants:
        c4 = results["claim4"][variant]
        sizes = c4["sft_by_size"]
        rows.append([
            variant,
            *(f"{_fmt(sizes[str(k)]['reward'])} / {_fmt(sizes[str(k)]['accuracy'])}"
              f" (n={sizes[str(k)]['items']})" for k in EVAL_SIZES),
            *(_fmt(c4["first_step_train_reward"].get(a, math.nan)) for a in ("seq3", "seq4", "seq5")),
        ])  # fmt: skip
    blocks.append(("table", header, rows))
    blocks.append(("p", " ".join(f"{v}: {results['claim4'][v]['sentence']}." for v in variants)))
    return blocks


def _curriculum_blocks(results: dict, variants: list[str]) -> list[tuple]:
    """The curriculum arm's draws and pass rates per bucket (nothing if it did not run)."""
    blocks: list[tuple] = []
    for variant in variants:
        summary = results["curriculum"].get(variant)
        if not summary:
            continue
        blocks.append(("h2", f"The curriculum's buckets ({variant})"))
        rows = [[b, f"{v['share']:.0%}" if math.isfinite(v["share"]) else "–",
                 _fmt(v["last_pass_rate"])] for b, v in summary.items()]  # fmt: skip
        blocks.append(("table", ["bucket (chain size)", "share of all draws", "last pass rate"],
                       rows))  # fmt: skip
        blocks.append(("img", f"plots/curriculum_{variant}.png"))
    return blocks


def _markdown(blocks: list[tuple]) -> str:
    out = []
    for kind, *args in blocks:
        if kind == "h":
            out.append(f"# {args[0]}")
        elif kind == "h2":
            out.append(f"## {args[0]}")
        elif kind == "p":
            out.append(args[0])
        elif kind == "table":
            out.append(md_table(*args))
        elif kind == "img":
            out.append(f"![{args[0]}]({args[0]})")
    return "\n\n".join(out) + "\n"


def _html(blocks: list[tuple], folder: Path) -> str:
    out = []
    for kind, *args in blocks:
        if kind in ("h", "h2", "p"):
            out.append(element({"h": "h1", "h2": "h2", "p": "p"}[kind], args[0]))
        elif kind == "table":
            out.append(html_table(*args))
        elif kind == "img" and (folder / args[0]).is_file():
            out.append(figure_html(folder / args[0]))
    return html_page("tirl study races", out)


def write_study_report(folder: Path) -> dict:
    """Read the study folder, analyse it, write study.md, report.html, plots/ and results.json;
    return the results."""
    folder = Path(folder)
    data = load(folder)
    results = analyse(data)
    variants = data["manifest"]["variants"]
    for variant in variants:
        _plot_curves(data, variant, folder / "plots" / f"curves_{variant}.png")
    _plot_sizes(results, variants, folder / "plots" / "sizes.png")
    for variant in results["curriculum"]:
        _plot_curriculum(data, variant, folder / "plots" / f"curriculum_{variant}.png")
    blocks = report_blocks(data, results)
    write_text(folder / "study.md", _markdown(blocks))
    write_text(folder / "report.html", _html(blocks, folder))
    results["mixtures"] = {
        f"{v}/{a}/{s}": {**run["mixture"], "problems": run["mixture_problems"]}
        for (v, a, s), run in data["runs"].items()
    }
    results["pool"] = data["manifest"]["pool"]
    write_text(folder / "results.json", json_text(results))
    return results
