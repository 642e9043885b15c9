"""tirl task sources as reasoning-gym datasets (export), so RACES can sit in a reasoning-gym
curriculum or composite beside reasoning-gym's own generators.

Importing this module registers, with reasoning-gym's own `register_dataset`:

- `tirl_races`: RACES composites (`tirl.tasks.sources.races`); its config keys are the `races`
  source's (`mixture`, `min_size`, `max_size`, `level`, `envs`, ...), plus a curriculum over
  the composition size (`min_size`..`max_size`, RACES's difficulty knob);
- `tirl_arithmetic`: the quickstart's arithmetic (`kinds`, `digits`);
- `tirl`: any registered tirl source, `source=NAME` with its keys in `params`.

Each also takes reasoning-gym's `seed` (None: a random one, as reasoning-gym does), `size` (the
virtual length) and tirl's `split` ("train" or "test"). So

    import reasoning_gym, tirl.integrations.reasoning_gym
    data = reasoning_gym.create_dataset("tirl_races", seed=1, size=100, mixture={"sort": 1.0})
    data.score_answer(extract_answer(model_text), data[0])

Items. `data[i]` is the tirl source's task `item(split, i)` with the source seeded by `seed`:
the question is the task's problem text, which says how to write the answer (RACES's own
`<answer>` form; for a task scored by its `\\boxed{}`, such as arithmetic, a last line asks for
the answer inside `<answer></answer>`, reasoning-gym's convention), `answer` the reference
answer as reasoning-gym callers extract it (the inside of the `<answer>` block for RACES), and
`metadata` says what scoring needs: `source_dataset` and `source_index` (reasoning-gym's keys,
which its composite dispatches on), `task_id`, `split`, `index`, `seed`, the source entry
(`tirl_source`), the task's `scoring` kind, `difficulty` (which reasoning-gym's `Experiment`
reads of every entry: RACES's size and operator, arithmetic's digits and kind) and, for RACES,
the stored task (`races_task`). tirl derives every item from a hash of
(source, config, split, seed, index) (`tirl.envs.seeding`), so the same seed gives the same
items, and seeds k apart are not one stream shifted by k as reasoning-gym's own
`Random(seed + idx)` streams are (research doc A.1).

Scoring. reasoning-gym hands `score_answer` an answer already taken out of the model's text (its
`extract_answer`: the last `<answer>` block, stripped), whereas a tirl scorer reads the model's
whole text. So the answer is first written back the way the task's scorer reads a final answer
(`model_text`): inside `<answer>…</answer>` for RACES (and for reasoning-gym-scored tasks), as
`\\boxed{…}` for arithmetic and math answers; and None (nothing extracted) as empty text. The
score is then exactly the tirl task's reward for that text: the same scorer is called (RACES:
the operator's reward from the stored task, partial credit for SEQUENTIAL and PARALLEL;
others: the source's task rebuilt from the metadata). `score_answer(entry["answer"], entry)` is
1 for every item.
"""

from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass, field
from typing import Any, ClassVar

try:
    from reasoning_gym.coaching import BaseCurriculum, RangeAttributeDefinition
    from reasoning_gym.dataset import ProceduralDataset
    from reasoning_gym.factory import DATASETS, register_dataset
    from reasoning_gym.utils import extract_answer
except ImportError as e:  # pragma: no cover - the extra is in the dev environment
    raise ImportError(
        f"tirl.integrations.reasoning_gym needs reasoning-gym ({e}): "
        "pip install 'tirl[reasoning-gym]'"
    ) from e

from tirl.config import ConfigError
from tirl.envs.dataset import MAX_SIZE
from tirl.envs.operators import OperatorTask
from tirl.tasks import Task, make_source
from tirl.tasks.base import SPLITS, TaskSource
from tirl.tasks.registry import SOURCES
from tirl.tasks.sources.races import operator_task
from tirl.tasks.sources.reasoning_gym import ANSWER_REQUEST

# How each scoring kind (a task's meta["scoring"]) reads a final answer from model text.
ANSWER_FORMS = {
    "races": "<answer>{}</answer>",
    "reasoning_gym": "<answer>{}</answer>",
    "integer": "\\boxed{{{}}}",
    "math": "\\boxed{{{}}}",
}
COMMON_KEYS = ("seed", "size", "split")


def model_text(answer: str | None, scoring: str) -> str:
    """The model text whose final answer is `answer`, written as scorers of `scoring` read it."""
    if scoring not in ANSWER_FORMS:
        raise ValueError(
            f"tasks scored by {scoring!r} cannot be exported to reasoning-gym (an extracted"
            f" answer has no known form there); known: {', '.join(ANSWER_FORMS)}"
        )
    return "" if answer is None else ANSWER_FORMS[scoring].format(answer)


def extracted_answer(task: Task) -> str:
    """The reference answer as reasoning-gym callers pass answers: a tagged reference's inside."""
    if ANSWER_FORMS.get(task.meta.get("scoring")) == ANSWER_FORMS["races"]:
        inside = extract_answer(task.answer)
        if inside is not None:
            return inside
    return task.answer


def question(task: Task) -> str:
    """The task's problem, saying how to write the answer: RACES problems and imported
    reasoning-gym ones already ask for an `<answer>` block; a problem scored by a `\\boxed{}`
    (arithmetic, math) gets reasoning-gym's form asked for in tirl's words (the `reasoning_gym`
    source's `ANSWER_REQUEST`), since reasoning-gym extracts the answer from that block."""
    if ANSWER_FORMS[task.meta["scoring"]] == ANSWER_FORMS["races"]:
        return task.problem
    return f"{task.problem.rstrip()}\n\n{ANSWER_REQUEST}"


def difficulty(task: Task, source: TaskSource) -> dict[str, Any]:
    """`metadata["difficulty"]`, which reasoning-gym's `Experiment` and `ScoreBoard` read for
    every entry (they group scores by it; its values must be hashable): RACES's composition
    size and operator, arithmetic's digits and kind, an imported reasoning-gym item's own, else
    the source's name."""
    meta = task.meta
    if meta["scoring"] == "races":
        return {"size": meta["size"], "operator": meta["operator"]}
    if task.source == "arithmetic":
        return {"digits": source.digits, "kind": meta["kind"]}
    inner = meta.get("entry", {}).get("metadata", {}).get("difficulty")
    return dict(inner) if isinstance(inner, dict) else {"source": task.source}


# ------------------------------------------------------------------------------ configs


@dataclass
class TirlConfig:
    """A tirl task source as a reasoning-gym dataset (`tirl`): `source` and its `params`."""

    DATASET: ClassVar[str] = "tirl"
    source: str = "arithmetic"
    params: dict[str, Any] = field(default_factory=dict)
    seed: int | None = None
    size: int = 500
    split: str = "train"

    def source_entry(self) -> dict[str, Any]:
        """The tirl source entry this config names (`tirl.tasks.make_source`), seed aside."""
        return {"source": self.source, **self.params}

    def validate(self) -> None:
        """ConfigError (a ValueError) on a bad value, naming `<dataset>.<key>`."""
        if "seed" in self.params or "source" in self.params:
            key = "seed" if "seed" in self.params else "source"
            raise ConfigError(f"tirl.params.{key}: set by the dataset's own {key!r}", key)
        check_common(self)


def check_common(config: Any) -> TaskSource:
    """Checks seed, size and split, and builds the source (tirl checks its keys); the source."""
    name = config.DATASET
    if config.split not in SPLITS:
        raise ConfigError(f"{name}.split must be one of {', '.join(SPLITS)}, got {config.split!r}")
    for key in ("size", "seed"):
        value = getattr(config, key)
        if value is None and key == "seed":
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < (key == "size"):
            wanted = "an integer >= 1" if key == "size" else "None or an integer >= 0"
            raise ConfigError(f"{name}.{key} must be {wanted}, got {value!r}", key)
    return make_source(config.source_entry(), name, seed=config.seed or 0)


@dataclass
class _SourceKeysConfig:
    """The reasoning-gym keys of a config whose other fields are one tirl source's keys."""

    DATASET: ClassVar[str] = ""
    SOURCE: ClassVar[str] = ""
    seed: int | None = None
    size: int = 500
    split: str = "train"

    def source_entry(self) -> dict[str, Any]:
        keys = [f.name for f in dataclasses.fields(self) if f.name not in COMMON_KEYS]
        return {"source": self.SOURCE, **{k: getattr(self, k) for k in keys}}

    def validate(self) -> None:
        """ConfigError (a ValueError) on a bad value, naming `<dataset>.<key>`."""
        check_common(self)


def source_config(dataset: str, source: str, class_name: str) -> type:
    """A config dataclass with the tirl source's own keys (same defaults and docs, read from its
    registered dataclass, so the two never drift apart) and seed, size and split."""
    keys = []
    for f in dataclasses.fields(SOURCES[source]):
        if not f.init or f.name in COMMON_KEYS:
            continue
        if f.default_factory is not dataclasses.MISSING:
            default = field(default_factory=f.default_factory, metadata=f.metadata)
        else:
            default = field(default=f.default, metadata=f.metadata)
        keys.append((f.name, f.type, default))
    namespace = {"DATASET": dataset, "SOURCE": source, "__module__": __name__}
    return dataclasses.make_dataclass(
        class_name, keys, bases=(_SourceKeysConfig,), namespace=namespace
    )


TirlRacesConfig = source_config("tirl_races", "races", "TirlRacesConfig")
TirlArithmeticConfig = source_config("tirl_arithmetic", "arithmetic", "TirlArithmeticConfig")


# ------------------------------------------------------------------------------ dataset


class TirlDataset(ProceduralDataset):
    """Items of a tirl source's split, scored by its tasks' own scorers (see the module doc)."""

    def __init__(self, config: Any) -> None:
        super().__init__(config=config, seed=config.seed, size=config.size)  # validates
        self.source = make_source(config.source_entry(), config.DATASET, seed=self.seed)
        self._sources: dict[str, TaskSource] = {}  # sources of entries made by other configs

    def __getitem__(self, idx: int) -> dict[str, Any]:
        if isinstance(idx, bool) or not isinstance(idx, int) or not 0 <= idx < self.size:
            raise IndexError(f"{self.config.DATASET}: index {idx!r} is not in [0, {self.size})")
        split = self.config.split
        task = self.source.item(split, idx)
        if task.meta.get("scoring") not in ANSWER_FORMS:
            model_text(None, task.meta.get("scoring"))  # raises: no answer form for this kind
        metadata = {
            "source_dataset": self.config.DATASET,
            "source_index": idx,
            "task_id": task.id,
            "split": split,
            "index": idx,
            "seed": self.seed,
            "tirl_source": self.config.source_entry(),
            "scoring": task.meta["scoring"],
        }
        if task.meta["scoring"] == "races":
            metadata["races_task"] = task.meta["races_task"]
        metadata["difficulty"] = difficulty(task, self.source)
        return {"question": question(task), "answer": extracted_answer(task), "metadata": metadata}

    def task(self, entry: dict[str, Any]) -> Task:
        """The tirl task an item of this dataset (or of another tirl dataset) came from."""
        meta = entry["metadata"]
        if "races_task" in meta:  # the stored task scores as it is: nothing to regenerate
            stored = OperatorTask.from_dict(meta["races_task"])
            return operator_task(stored, meta["task_id"], meta["split"], "races")
        source = self.source
        if meta["tirl_source"] != self.config.source_entry() or meta["seed"] != self.seed:
            key = json.dumps([meta["tirl_source"], meta["seed"]], sort_keys=True)
            if key not in self._sources:
                self._sources[key] = make_source(meta["tirl_source"], "metadata", meta["seed"])
            source = self._sources[key]
        task = source.item(meta["split"], meta["index"])
        if task.id != meta["task_id"]:
            raise ValueError(
                f"the entry names task {meta['task_id']!r}, its source gives {task.id!r}"
            )
        return task

    def score_answer(self, answer: str | None, entry: dict[str, Any]) -> float:
        """tirl's reward for `answer` (an extracted answer, None if none was found), written back
        as the task's scorer reads a final answer (`model_text`)."""
        text = model_text(answer, entry["metadata"]["scoring"])
        return float(self.task(entry).score(text).reward)


class TirlRacesCurriculum(BaseCurriculum):
    """Composition size as the difficulty (RACES §3): level L allows composites of 1..L+1
    environments (reasoning-gym's inclusive range mode), up to tirl's largest."""

    def __init__(self) -> None:
        super().__init__(type(self).__name__, TirlRacesConfig)
        self._define_attributes(
            RangeAttributeDefinition(
                name="size",
                levels=list(range(1, MAX_SIZE + 1)),
                description="environments composed in one task",
                lower_field_name="min_size",
                upper_field_name="max_size",
            )
        )


for _name, _config, _curriculum in (
    ("tirl", TirlConfig, None),
    ("tirl_races", TirlRacesConfig, TirlRacesCurriculum),
    ("tirl_arithmetic", TirlArithmeticConfig, None),
):
    if _name not in DATASETS:  # a second import (a reload) finds them registered
        register_dataset(_name, TirlDataset, _config, _curriculum)
