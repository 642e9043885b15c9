"""The `tirl synth run` config: which stages run, the teacher and judge endpoints, the limits.

Loaded with `tirl.config.load_config` (YAML + dotted overrides, strict types). Each field's range
and doc are declared with `setting` and checked on load; `validate` adds the cross-field rules,
so a bad value fails at startup with one line naming the key.
"""

from __future__ import annotations

from dataclasses import dataclass

from tirl.config import ConfigError, setting
from tirl.protocol import PROTOCOLS
from tirl.sandbox.config import SandboxConfig
from tirl.synth.prompts import CODEIFY_EXAMPLES
from tirl.tools import DEFAULT_TOOLS, tools_problem

# The modules a teacher's code most often imports, preloaded for every session.
SYNTH_PRELOAD = ("math", "fractions", "sympy", "numpy")

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


def _url_problem(url: str) -> str | None:
    if url and not url.startswith(("http://", "https://")):
        return "must start with http:// or https://"
    return None


@dataclass
class InputConfig:
    """Field names of the source records, and what to do with a bad one."""

    problem_field: str = setting("problem", doc="record field holding the problem")
    cot_field: str = setting("solution", doc="record field holding the chain of thought")
    answer_field: str = setting("answer", doc="record field holding the final answer")
    id_field: str | None = setting(
        "id", doc="record field holding the id; null or absent: a hash of the problem"
    )
    skip_bad_records: bool = setting(
        False, doc="count bad records with their reason; false: the first one stops the run"
    )
    split: str = setting("train", doc="split of an hf:<dataset> input")


@dataclass
class EndpointConfig:
    """An OpenAI-compatible server (vLLM, SGLang, `tirl serve`, a hosted API)."""

    url: str = setting(
        "",
        doc="e.g. http://127.0.0.1:8000 (the /v1/... paths are added)",
        check=_url_problem,
    )
    model: str | None = setting(None, doc="model name; null: the first of GET /v1/models")
    api_key_env: str | None = setting(
        None,
        doc="name of an environment variable holding a bearer token; null: TIRL_API_KEY when"
        " set (so a hosted teacher is sent that key: name another variable for it)",
    )
    concurrency: int = setting(8, "[1, 10000]", "requests in flight")
    max_retries: int = setting(5, "[0, 100]", "retries of a failed request (429, 5xx, network)")
    backoff_s: float = setting(1.0, "[0, 3600]", "first retry waits this long, then doubles")
    timeout_s: float = setting(300.0, "(0, 86400]", "per request, in seconds")
    temperature: float = setting(0.0, "[0, 100]", "sampling temperature")
    max_tokens: int = setting(4096, ">= 1", "completion tokens per request")
    price_prompt_per_1k: float = setting(
        0.0, ">= 0", "cost accounting, in your currency per 1000 prompt tokens"
    )
    price_completion_per_1k: float = setting(
        0.0, ">= 0", "cost accounting, in your currency per 1000 completion tokens"
    )


@dataclass
class StagesConfig:
    """Which stages of the AgentMath pipeline run (`tirl.synth.stages`)."""

    decontaminate: bool = setting(True, doc="drop problems that overlap a benchmark")
    codeify: bool = setting(True, doc="the teacher rewrites the CoT with code blocks")
    format: bool = setting(True, doc="repair or reject malformed blocks")
    execute: bool = setting(True, doc="run every block in one session per trajectory")
    self_correct: bool = setting(True, doc="the teacher diagnoses and fixes a failing block")
    replace_outputs: bool = setting(True, doc="put the real outputs in place of simulated ones")
    feedback_alignment: bool = setting(True, doc="a judge checks text against changed outputs")
    code_limits: bool = setting(True, doc="AST depth and line limits per block")
    answer_check: bool = setting(True, doc="the final answer must verify against the gold")


@dataclass
class DecontamConfig:
    n: int = setting(13, "[1, 1000]", "n-gram length, in normalized words")
    benchmarks: list[str] = setting(factory=list, doc="benchmark names (math500, ...) or files")
    benchmark_dir: str | None = setting(
        None, doc="where named benchmarks live (else $TIRL_BENCHMARK_DIR)"
    )


@dataclass
class LimitsConfig:
    """Per code block: code past these limits is needless or unreadable (AgentMath §3.1)."""

    max_ast_depth: int = setting(12, ">= 1", "deepest AST nesting allowed")
    max_lines: int = setting(40, ">= 1", "lines allowed")
    min_ast_depth: int = setting(
        0, ">= 0", "> 0 also rejects trivial blocks (a bare print of a literal)"
    )


@dataclass
class SynthConfig:
    plugins: list[str] = setting(
        factory=list,
        doc="modules (or .py files, relative to the config file) imported before the config is"
        " checked: protocols, tools or task sources of your own (tirl.plugins)",
    )
    input: InputConfig = setting(factory=InputConfig, doc="the source records")
    stages: StagesConfig = setting(factory=StagesConfig, doc="which stages run")
    decontam: DecontamConfig = setting(factory=DecontamConfig, doc="decontamination")
    teacher: EndpointConfig = setting(factory=EndpointConfig, doc="the teacher model's server")
    judge: EndpointConfig | None = setting(None, doc="the judge's server; null: the teacher")
    limits: LimitsConfig = setting(factory=LimitsConfig, doc="code limits per block")
    sandbox: SandboxConfig = setting(
        factory=lambda: SandboxConfig(preload=list(SYNTH_PRELOAD)),
        doc="where the demonstrations' code runs, and what of its output they show (train with"
        " the same max_output_chars)",
    )
    output_format: str = setting(
        "agentmath_tags",
        doc="the protocol the trajectories are written in (a registered protocol)",
        check=PROTOCOLS.problem,
    )
    tools: list[str] = setting(
        factory=lambda: list(DEFAULT_TOOLS),
        doc="the tools the teacher may use (tirl.tools: python, shell); train with the same",
        check=tools_problem,
    )
    concurrency: int = setting(16, "[1, 100000]", "trajectories in flight per stage")
    codeify_examples: int = setting(
        0,
        f"[0, {len(CODEIFY_EXAMPLES)}]",
        "worked examples of the rewrite the teacher sees first, as earlier chat turns (0:"
        " AgentMath's prompt, none; a small teacher writes no tags without them)",
    )

    def validate(self) -> None:
        s = self.stages
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
