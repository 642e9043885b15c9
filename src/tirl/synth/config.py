"""The `tirl synth run` config: which stages run, the teacher and judge endpoints, the limits.

Loaded with `tirl.config.load_config` (YAML + dotted overrides, strict types); `validate` adds
the cross-field rules, so a bad value fails at startup with one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from tirl.config import ConfigError

STAGE_NAMES = (
    "decontaminate",
    "codeify",
    "format",
    "execute",
    "self_correct",
    "replace_outputs",
    "feedback_alignment",
    "code_limits",
    "answer_check",
)


@dataclass
class InputConfig:
    """Field names of the source records, and what to do with a bad one."""

    problem_field: str = "problem"
    cot_field: str = "solution"
    answer_field: str = "answer"
    id_field: str | None = "id"  # None, or absent in a record: the id is a hash of the problem
    skip_bad_records: bool = False  # False: the first bad record stops the run with its line
    split: str = "train"  # for hf:<dataset> inputs


@dataclass
class EndpointConfig:
    """An OpenAI-compatible server (vLLM, SGLang, `tirl serve`, a hosted API)."""

    url: str = ""  # e.g. http://127.0.0.1:8000 (the /v1/... paths are added)
    model: str | None = None  # None: the first model of GET /v1/models
    api_key_env: str | None = None  # name of an environment variable holding a bearer token
    concurrency: int = 8
    max_retries: int = 5
    backoff_s: float = 1.0  # first retry waits this long, then doubles
    timeout_s: float = 300.0
    temperature: float = 0.0
    max_tokens: int = 4096
    price_prompt_per_1k: float = 0.0  # cost accounting, in your currency per 1000 tokens
    price_completion_per_1k: float = 0.0

    def validate(self) -> None:
        if self.concurrency < 1 or self.max_retries < 0 or self.max_tokens < 1:
            raise ConfigError("concurrency and max_tokens must be >= 1, max_retries >= 0")
        if self.backoff_s < 0 or self.timeout_s <= 0 or self.temperature < 0:
            raise ConfigError("backoff_s and temperature must be >= 0 and timeout_s > 0")
        if min(self.price_prompt_per_1k, self.price_completion_per_1k) < 0:
            raise ConfigError("prices must be >= 0")
        if self.url and not self.url.startswith(("http://", "https://")):
            raise ConfigError(f"url must start with http:// or https://, got {self.url!r}")


@dataclass
class StagesConfig:
    decontaminate: bool = True
    codeify: bool = True
    format: bool = True
    execute: bool = True
    self_correct: bool = True
    replace_outputs: bool = True
    feedback_alignment: bool = True
    code_limits: bool = True
    answer_check: bool = True


@dataclass
class DecontamConfig:
    n: int = 13  # n-gram length, in normalized words
    benchmarks: list[str] = field(default_factory=list)  # names (math500, ...) or files
    benchmark_dir: str | None = None  # where named benchmarks live (else $TIRL_BENCHMARK_DIR)

    def validate(self) -> None:
        if self.n < 1:
            raise ConfigError(f"n must be at least 1, got {self.n}")


@dataclass
class LimitsConfig:
    """Per code block: code past these limits is needless or unreadable (AgentMath §3.1)."""

    max_ast_depth: int = 12
    max_lines: int = 40
    min_ast_depth: int = 0  # > 0 also rejects trivial blocks (a bare print of a literal)

    def validate(self) -> None:
        if self.max_ast_depth < 1 or self.max_lines < 1 or self.min_ast_depth < 0:
            raise ConfigError("max_ast_depth and max_lines must be >= 1, min_ast_depth >= 0")


@dataclass
class SandboxConfig:
    timeout_s: float = 5.0
    memory_mb: int = 1024
    max_output_chars: int = 2000  # what the model sees, through tirl.sandbox.format_result
    preload: list[str] = field(default_factory=lambda: ["math", "fractions", "sympy", "numpy"])

    def validate(self) -> None:
        if self.timeout_s <= 0 or self.memory_mb < 64 or self.max_output_chars < 16:
            raise ConfigError("need timeout_s > 0, memory_mb >= 64, max_output_chars >= 16")


@dataclass
class SynthConfig:
    input: InputConfig = field(default_factory=InputConfig)
    stages: StagesConfig = field(default_factory=StagesConfig)
    decontam: DecontamConfig = field(default_factory=DecontamConfig)
    teacher: EndpointConfig = field(default_factory=EndpointConfig)
    judge: EndpointConfig | None = None  # None: the teacher judges too
    limits: LimitsConfig = field(default_factory=LimitsConfig)
    sandbox: SandboxConfig = field(default_factory=SandboxConfig)
    output_format: Literal["agentmath_tags", "cir_fences"] = "agentmath_tags"
    concurrency: int = 16  # trajectories in flight per stage

    def validate(self) -> None:
        s = self.stages
        if self.concurrency < 1:
            raise ConfigError(f"concurrency must be at least 1, got {self.concurrency}")
        needs_exec = [
            n for n in ("self_correct", "replace_outputs", "feedback_alignment") if getattr(s, n)
        ]
        if needs_exec and not s.execute:
            raise ConfigError(f"stages.{needs_exec[0]} needs stages.execute")
        uses_teacher = s.codeify or s.self_correct
        if uses_teacher and not self.teacher.url:
            raise ConfigError("teacher.url is required when stages.codeify or self_correct is on")
        if s.feedback_alignment and not (self.judge or self.teacher).url:
            raise ConfigError("judge.url (or teacher.url) is required for feedback_alignment")

    @property
    def judge_endpoint(self) -> EndpointConfig:
        return self.judge or self.teacher

    def enabled(self) -> list[str]:
        return [n for n in STAGE_NAMES if getattr(self.stages, n)]
