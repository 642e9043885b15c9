"""A trajectory as token segments: the prompt, what the model sampled, what the tool returned.

The segments hold the exact token ids the policy was conditioned on and sampled (architecture.md,
invariant 1: token-in, token-out). Only tool output is tokenized, separately, by the rollout.
The loss mask is derived from the segment kinds, so it can never drift from the content:
model tokens have mask 1, prompt and tool tokens mask 0 (invariant 2).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum


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
    budget ran out) or "error".
    """

    segments: list[Segment] = field(default_factory=list)
    tool_calls: list[ToolCall] = field(default_factory=list)
    finish_reason: str = "stop"
    meta: dict = field(default_factory=dict)

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
        return {
            "segments": [
                {"kind": s.kind.value, "ids": s.ids, "text": s.text, "logprobs": s.logprobs}
                for s in self.segments
            ],
            "tool_calls": [vars(c) for c in self.tool_calls],
            "finish_reason": self.finish_reason,
            "meta": self.meta,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Trajectory:
        return cls(
            segments=[
                Segment(
                    SegmentKind(s["kind"]), list(s["ids"]), s.get("text", ""), s.get("logprobs")
                )
                for s in d["segments"]
            ],
            tool_calls=[ToolCall(**c) for c in d.get("tool_calls", [])],
            finish_reason=d.get("finish_reason", "stop"),
            meta=dict(d.get("meta", {})),
        )
