"""A trajectory as token segments: the prompt, what the model sampled, what the tool returned.

The segments hold the exact token ids the policy was conditioned on and sampled (architecture.md,
invariant 1: token-in, token-out). Only tool output is tokenized, separately, by the rollout.
The loss mask is derived from the segment kinds, so it can never drift from the content:
model tokens have mask 1, prompt and tool tokens mask 0 (invariant 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum

from tirl.protocol.score import Score

# The meta keys a scored trajectory carried before `task_id` and `score` were fields; files
# written then are still read (`Trajectory.from_dict` moves them into the fields).
LEGACY_SCORE_KEYS = ("task_id", "predicted", "correct", "reason", "task_reward")


class SegmentKind(str, Enum):
    PROMPT = "prompt"
    MODEL = "model"
    TOOL = "tool"


@dataclass
class Segment:
    """A run of tokens from one source.

    `logprobs` holds, for MODEL segments produced by a sampler, the log-probability of each
    sampled id under the sampling policy (same length as `ids`); it is None for prompt and tool
    segments and for model segments written by hand (SFT data).
    """

    kind: SegmentKind
    ids: list[int]
    text: str = ""
    logprobs: list[float] | None = None

    def __post_init__(self) -> None:
        if self.logprobs is not None and len(self.logprobs) != len(self.ids):
            raise ValueError(
                f"{self.kind.value} segment has {len(self.ids)} ids but {len(self.logprobs)} logprobs"
            )


@dataclass
class ToolCall:
    """One executed (or refused) code block and what came back.

    `tool` is the registered tool the block was for (`tirl.tools`): "python" for the
    protocol's own code block, and for records written before there were other tools.
    """

    code: str
    # a tirl.sandbox Status value; "skipped" when the budget was spent, "disabled" when the
    # block is for a tool the run did not enable (neither one ran)
    status: str
    output_text: str  # exactly the text shown to the model (before tokenization)
    duration_s: float = 0.0
    tool: str = "python"


@dataclass
class Trajectory:
    """One rollout: an ordered list of segments plus what happened along the way.

    `finish_reason` is "stop" (the model emitted end-of-sequence), "length" (the model-token
    budget ran out) or "error". `task_id` is the id of the task it answers and `score` what that
    task's scorer said of it; both are set by `tirl.tasks.scoring.score_trajectory` (a failed
    trajectory gets its `task_id` and no score). `meta` holds the rest, free-form (the seed,
    the RL reward, the question and gold answer shown by reports, errors).
    """

    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    meta: dict = field(default_factory=dict)
    task_id: str | None = None
    score: Score | None = None

    @property
    def correct(self) -> bool:
        """Whether its score says correct (False when it was never scored)."""
        return self.score is not None and self.score.correct

    @property
    def ids(self) -> list[int]:
        return [i for s in self.segments for i in s.ids]

    @property
    def loss_mask(self) -> list[int]:
        """1 on model tokens, 0 on prompt and tool tokens, aligned with `ids`."""
        return [int(s.kind is SegmentKind.MODEL) for s in self.segments for _ in s.ids]

    @property
    def prompt_len(self) -> int:
        n = 0
        for s in self.segments:
            if s.kind is not SegmentKind.PROMPT:
                break
            n += len(s.ids)
        return n

    @property
    def response_segments(self) -> list[Segment]:
        return [s for s in self.segments if s.kind is not SegmentKind.PROMPT]

    @property
    def model_text(self) -> str:
        """The text of model segments only: where answers are read from (invariant 3)."""
        return "".join(s.text for s in self.segments if s.kind is SegmentKind.MODEL)

    @property
    def response_text(self) -> str:
        return "".join(s.text for s in self.response_segments)

    @property
    def num_model_tokens(self) -> int:
        return sum(len(s.ids) for s in self.segments if s.kind is SegmentKind.MODEL)

    @property
    def num_tool_tokens(self) -> int:
        return sum(len(s.ids) for s in self.segments if s.kind is SegmentKind.TOOL)

    def to_dict(self) -> dict:
        """JSON-safe; `task_id` and `score` only when set."""
        d = {
            "segments": [
                {"kind": s.kind.value, "ids": s.ids, "text": s.text, "logprobs": s.logprobs}
                for s in self.segments
            ],
            "tool_calls": [vars(c) for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "meta": self.meta,
        }
        if self.task_id is not None:
            d["task_id"] = self.task_id
        if self.score is not None:
            d["score"] = self.score.to_dict()
        return d

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        """What `to_dict` wrote; also a dict written when the score was meta keys
        (`LEGACY_SCORE_KEYS`), whose score and task id then move out of meta into the fields."""
        meta = dict(d.get("meta", {}))
        task_id, score = d.get("task_id"), d.get("score")
        if task_id is None and "score" not in d and "correct" in meta:  # written before fields
            task_id = meta.get("task_id")
            correct = bool(meta["correct"])
            score = {
                "reward": meta.get("task_reward", float(correct)),
                "correct": correct,
                "reason": meta.get("reason", ""),
                "predicted": meta.get("predicted"),
            }
            for key in LEGACY_SCORE_KEYS:
                meta.pop(key, None)
        elif task_id is None and "score" not in d and "task_id" in meta:  # a failed one
            task_id = meta.pop("task_id")
        return cls(
            segments=[
                Segment(
                    SegmentKind(s["kind"]), list(s["ids"]), s.get("text", ""), s.get("logprobs")
                )
                for s in d["segments"]
            ],
            tool_calls=[ToolCall(**c) for c in d.get("tool_calls", [])],
            finish_reason=d.get("finish_reason", "stop"),
            meta=meta,
            task_id=None if task_id is None else str(task_id),
            score=None if score is None else Score.from_dict(score),
        )
