"""`reasoning_gym`: any reasoning-gym dataset as a task source, scored by its own `score_answer`.

reasoning-gym (github.com/open-thought/reasoning-gym, `pip install 'tirl[reasoning-gym]'`)
generates items `{question, answer, metadata}` with `create_dataset(name, seed=, size=, **cfg)`
and scores an answer the caller has already taken out of the model's text. Here:

- Items. One reasoning-gym stream per source: `create_dataset(dataset, seed=S, size=stream_size,
  **config)`, S a hash of (dataset, config, seed) (`_stream_seed`), so two runs whose seeds
  differ by k do not see the same stream shifted by k, as two reasoning-gym seeds do
  (reasoning-gym draws item idx from `Random(seed + idx)`; research doc A.1). Each item goes to
  the split its question hashes to (`tirl.envs.seeding.split_of`, one in eight to `test`), so
  the two splits never share a question, not even when the dataset repeats one; a split is that
  stream's items of the split, in order, and cycles over them past the `stream_size` stream
  items (`size(split)` is None: counting would generate the whole stream). What this does not
  guarantee: that two different `seed`s give disjoint streams (their hashed S are 32-bit
  numbers, so their `seed + idx` ranges overlap with probability about 2 * stream_size / 2**32).
- The problem: the question, then a line asking for the final answer inside
  `<answer></answer>` (reasoning-gym's convention: its system prompts ask for that tag).
- The scorer: the last `<answer>` block of the model's prose, read by reasoning-gym's own
  `extract_answer`, handed to the dataset's `score_answer` with the stored item. Its score is
  the reward, and it may be partial (the default `score_answer` gives len(gold)/len(answer)
  when the gold answer is a substring of a longer one); correct iff the reward is 1. A
  `score_answer` that raises, or returns a value outside [0, 1], scores 0 with that as the
  reason (fail closed, as RACES). Trap: reasoning-gym 0.1.25's `spell_backward` sums 1/len per
  matching letter and compares the sum with 1.0 exactly, so the word followed by extra letters
  scores 1 ± an ulp instead of its intended 0.8 (above 1: scored 0 here; below: passed on).
- The reference answer (`Task.answer`) is the gold answer inside an `<answer>` block: model
  text that scores 1. No teacher-free demonstrations (a generator's gold answer is not a
  solution): SFT needs `sft.data` or `sft.steps: 0`.

reasoning-gym is imported on first use, not with this module, and only from its installed
package: importing it and generating items makes no network access (`tests/
test_reasoning_gym.py` checks it with an audit hook).
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import Any

from tirl.config import ConfigError, setting
from tirl.envs.seeding import SPLITS, split_of
from tirl.tasks.base import DemoPart, Score, Scorer, Task
from tirl.tasks.registration import register_source

INSTALL_HINT = "pip install 'tirl[reasoning-gym]'"
ANSWER_REQUEST = "Give only your final answer inside <answer></answer> tags, at the end."
MAX_STREAM = 2**24  # most items a stream holds (reasoning-gym seeds + idx must stay < 2**32)
# the source sets these (`seed` and `stream_size`); a dataset's `config` may not
RESERVED_KEYS = {"seed": "seed", "size": "stream_size"}


def dataset_problem(name: str) -> str | None:
    """Why `name` cannot be a reasoning-gym dataset here (reasoning-gym not installed, or no
    such dataset, with the close names), or None. The `dataset` key's check."""
    if not isinstance(name, str):
        return "must be a reasoning-gym dataset name"
    try:
        from reasoning_gym.factory import DATASETS
    except ImportError as e:
        return f"needs reasoning-gym, which cannot be imported ({e}): {INSTALL_HINT}"
    if name in DATASETS:
        return None
    close = difflib.get_close_matches(name, list(DATASETS), n=4)
    hint = f"did you mean {', '.join(close)}?" if close else f"{len(DATASETS)} are registered"
    return f"names no reasoning-gym dataset ({hint})"


def _stream_seed(dataset: str, config: dict[str, Any], seed: int) -> int:
    """The reasoning-gym seed of a source's stream: a hash, below 2**32 - MAX_STREAM so that
    seed + idx fits numpy's 32-bit seeds (reasoning-gym's pool_matrix seeds numpy with it)."""
    blob = json.dumps(["reasoning_gym", dataset, config, seed], sort_keys=True, default=str)
    digest = int.from_bytes(hashlib.sha256(blob.encode()).digest()[:8], "big")
    return digest % (2**32 - MAX_STREAM)


def score_entry(dataset: Any, entry: dict[str, Any], model_text: str) -> Score:
    """`dataset.score_answer` of the last `<answer>` block of `model_text`; correct at 1."""
    from reasoning_gym.utils import extract_answer

    predicted = extract_answer(model_text)
    if predicted is None:
        return Score(0.0, False, "no <answer>…</answer> block", None)
    try:
        reward = float(dataset.score_answer(predicted, entry))
    except Exception as e:  # noqa: BLE001 - a dataset's scorer fails closed, its bugs included
        return Score(0.0, False, f"score_answer failed: {type(e).__name__}: {e}", predicted)
    if not (math.isfinite(reward) and 0.0 <= reward <= 1.0):  # out of contract: fail closed
        return Score(0.0, False, f"score_answer returned {reward!r}, outside [0, 1]", predicted)
    reason = "equal" if reward == 1.0 else f"score_answer gave {reward:g}"
    return Score(reward, reward == 1.0, reason, predicted)


_SCORING_DATASETS: dict[str, Any] = {}  # (dataset, config) -> a dataset to score with


def meta_scorer(meta: Mapping[str, Any]) -> Scorer:
    """The scorer of a task this source made, from its meta alone (`dataset`, `config` and the
    stored `entry`): for a process that did not build the task (`tirl.tasks.serialize`). The
    dataset is rebuilt with the same config; its seed and size do not enter `score_answer`."""
    problem = dataset_problem(meta.get("dataset"))
    if problem:
        raise ValueError(f"dataset {problem}, got {meta.get('dataset')!r}")
    from reasoning_gym.factory import create_dataset

    config = dict(meta.get("config") or {})
    key = json.dumps([meta["dataset"], config], sort_keys=True, default=str)
    if key not in _SCORING_DATASETS:
        _SCORING_DATASETS[key] = create_dataset(meta["dataset"], seed=0, size=1, **config)
    dataset, entry = _SCORING_DATASETS[key], meta["entry"]
    return lambda text: score_entry(dataset, entry, text)


@register_source("reasoning_gym")
@dataclass
class ReasoningGymSource:
    """A reasoning-gym dataset by name and config, scored by its own `score_answer`."""

    dataset: str = setting(
        doc="required: a reasoning-gym dataset name, e.g. leg_counting", check=dataset_problem
    )
    config: dict[str, Any] = setting(
        factory=dict,
        doc="the dataset's config keys (passed to reasoning_gym.create_dataset), but not seed"
        " or size",
    )
    stream_size: int = setting(
        10_000,
        f"[1, {MAX_STREAM}]",
        "items drawn from the dataset, shared out by the splits (each split cycles over its share)",
    )
    seed: int = setting(0, ">= 0", "seeds the stream (default: the run's seed)")
    name: str = field(default="reasoning_gym", init=False, repr=False)

    def __post_init__(self) -> None:
        self._dataset: Any = None  # the reasoning-gym dataset (built by validate)
        self._next = 0  # the stream index the caches have read up to
        self._cache: dict[str, list[tuple[int, dict[str, Any]]]] = {s: [] for s in SPLITS}
        self._checked = False

    def validate(self) -> None:
        """Builds the dataset (ConfigError naming the key: an unknown name, a config key the
        dataset's config lacks, a value it rejects, reasoning-gym not installed); called by
        `make_source`, and on first use otherwise."""
        problem = dataset_problem(self.dataset)  # checked already when built from a config
        if problem:
            raise ConfigError(f"dataset {problem}, got {self.dataset!r}", "dataset")
        from reasoning_gym.factory import DATASETS, create_dataset

        keys = [f.name for f in fields(DATASETS[self.dataset][1]) if f.name not in RESERVED_KEYS]
        for key in self.config:
            if key in RESERVED_KEYS:
                raise ConfigError(
                    f"config.{key}: set by the source's own {RESERVED_KEYS[key]!r} key, not in config",
                    f"config.{key}",
                )
            if key not in keys:
                close = difflib.get_close_matches(str(key), keys, n=3)
                hint = (
                    f"did you mean {', '.join(close)}?" if close else f"its keys: {', '.join(keys)}"
                )
                raise ConfigError(
                    f"config.{key}: {self.dataset}'s config has no key {key!r}; {hint}",
                    f"config.{key}",
                )
        seed = _stream_seed(self.dataset, self.config, self.seed)
        try:
            self._dataset = create_dataset(
                self.dataset, seed=seed, size=self.stream_size, **self.config
            )
        except Exception as e:  # noqa: BLE001 - reasoning-gym checks configs with assert
            why = str(e) or type(e).__name__
            raise ConfigError(f"config: {self.dataset} rejects it: {why}", "config") from None
        self._checked = True

    def _entries(self, split: str, index: int) -> list[tuple[int, dict[str, Any]]]:
        """The split's (stream index, item) pairs, at least index + 1 of them unless the
        stream ends first; reading on shares each item out to the split its question hashes to."""
        cache = self._cache[split]
        while len(cache) <= index and self._next < self.stream_size:
            entry = self._dataset[self._next]
            self._cache[split_of(f"reasoning_gym/{self.dataset}", entry["question"])].append(
                (self._next, entry)
            )
            self._next += 1
        return cache

    def item(self, split: str, index: int) -> Task:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        if not self._checked:
            self.validate()
        entries = self._entries(split, index)
        if not entries:
            raise ConfigError(
                f"reasoning_gym: the {self.stream_size} items drawn from {self.dataset} hold no"
                f" {split} item (one question in eight goes to test); raise stream_size",
                "stream_size",
            )
        k = index % len(entries)
        stream_index, entry = entries[k]
        dataset = self._dataset
        return Task(
            id=f"reasoning_gym/{self.dataset}/{split}/{k}",
            split=split,
            problem=f"{entry['question'].rstrip()}\n\n{ANSWER_REQUEST}",
            answer=f"<answer>{entry['answer']}</answer>",
            scorer=lambda text: score_entry(dataset, entry, text),
            source=self.name,
            meta={
                "scoring": "reasoning_gym",
                "dataset": self.dataset,
                "config": dict(self.config),
                "stream_index": stream_index,
                "entry": entry,
            },
        )

    def size(self, split: str) -> int | None:
        return None  # counting a split's share would generate the whole stream

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_dataset"] = None  # rebuilt on first use by a copy (validate)
        state["_checked"] = False
        return state

    def demonstration(self, task: Task, use_tools: bool) -> list[DemoPart] | None:
        return None
