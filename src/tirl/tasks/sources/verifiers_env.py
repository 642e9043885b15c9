"""`verifiers`: the tasks of a single-turn environment of PrimeIntellect's verifiers (0.4.0, the
v1 API), scored by the environment's own rewards.

A verifiers environment is a taskset (docs/v1/tasksets.md): `env` is its id, resolved as
verifiers resolves it (`verifiers.v1.utils.loaders`: the built-in taskset of that name, else
the installed module of that name, `-` read as `_`), and `args` are its taskset config fields,
checked by the taskset's own config class. Each task's prompt text is a tirl problem (a system
prompt the task carries goes first, as verifiers' harnesses fold it into a text prompt), its
`answer` field (if any) the reference answer.

Scoring: the model's prose (what every tirl scorer reads) becomes the one assistant reply of a
verifiers trace, and the task's own `score` runs its `@vf.reward` functions (and plugged ones)
on it, as at the end of a verifiers rollout. The reward is their weighted sum, clipped to
[0, 1]; the task counts as correct at 1; the reason lists each reward; `predicted` is the
reply's last 200 characters (verifiers parses no answer out of it).

Splits: verifiers tasksets have none, so each task goes to the split its key hashes to
(`tirl.envs.seeding.split_of`, as RACES files do): train and test never share a task. Tasks are
loaded once, in the taskset's order, at most `max_tasks` of them (an infinite taskset is cut
there).

Supported: single-turn text tasks whose rewards read the task and the trace. Refused, in one
line each when the source is built: a task that needs a container or a runtime to score, tools
(toolsets), LLM judges, a taskset with an `Env` of its own (multi-agent control flow), and a
taskset without rewards. Needs `pip install 'tirl[verifiers]'`.
"""

from __future__ import annotations

import asyncio
import inspect
import threading
from dataclasses import dataclass, field
from typing import Any

from tirl.config import ConfigError, setting
from tirl.envs.seeding import split_of
from tirl.tasks.base import SPLITS, Score, Task
from tirl.tasks.registration import register_source

INSTALL = "pip install 'tirl[verifiers]'"


def _verifiers():
    """verifiers.v1, or a one-line ConfigError saying how to install it."""
    try:
        import verifiers.v1 as vf
    except ImportError:
        raise ConfigError(
            f"env: the verifiers task source needs the verifiers package: {INSTALL}", "env"
        ) from None
    return vf


class _Loop:
    """One event loop on a daemon thread, shared by every verifiers scorer: a scorer is
    called synchronously, possibly from inside a running loop (tirl's rollouts), so the
    task's async `score` runs there."""

    _loop: asyncio.AbstractEventLoop | None = None
    _guard = threading.Lock()

    @classmethod
    def run(cls, coro) -> Any:
        with cls._guard:
            if cls._loop is None:
                cls._loop = asyncio.new_event_loop()
                threading.Thread(target=cls._loop.run_forever, daemon=True).start()
        return asyncio.run_coroutine_threadsafe(coro, cls._loop).result()


def _refusal(vf, taskset, task) -> str | None:
    """Why this source cannot serve `task` (see the module doc), or None."""
    from verifiers.v1.utils.loaders import environment_class

    env = environment_class(taskset.config.id)
    hooks = ("run", "setup", "finalize", "start", "stop")
    # An Env that only changes the seat's defaults (tirl-verifiers' TirlEnv) plays as the plain one.
    if not issubclass(env, vf.SingleAgentEnv) or any(
        getattr(env, hook) is not getattr(vf.SingleAgentEnv, hook) for hook in hooks
    ):
        return "its taskset brings its own Env (multi-agent control flow)"
    if task.NEEDS_CONTAINER:
        return "its tasks need a container"
    if type(task).toolsets(task.config) or type(taskset).toolsets(taskset.config):
        return "its tasks use tools (toolsets)"
    if task.config.judges:
        return "its tasks are scored by LLM judges"
    rewards = task.hooks("reward")
    if not rewards:
        return "its tasks have no reward function"
    for fn in rewards:
        param = inspect.signature(fn).parameters.get("runtime")
        if param is not None and param.default is inspect.Parameter.empty:
            return f"its reward {fn.__name__!r} needs a runtime"
    return None


def _score(vf, task, model_text: str) -> Score:
    """The task's own rewards on a trace whose one assistant reply is `model_text`."""
    trace = vf.Trace(
        task=vf.TraceTask(type=type(task).__name__, data=task.data, key=task.key, hash=task.hash),
        agent=vf.AgentInfo(config=vf.AgentConfig(runtime=vf.SubprocessConfig())),  # a record only
        nodes=[
            vf.MessageNode(message=vf.UserMessage(content=task.data.prompt_text)),
            vf.MessageNode(parent=0, message=vf.AssistantMessage(content=model_text), sampled=True),
        ],
    )
    _Loop.run(task.score(trace))
    reward = min(1.0, max(0.0, trace.reward))
    reason = ", ".join(f"{name}={r.score:g}" for name, r in trace.rewards.items() if r is not None)
    return Score(reward, reward == 1.0, reason, model_text.strip()[-200:] or None)


@register_source("verifiers")
@dataclass
class VerifiersSource:
    """A single-turn verifiers environment's tasks, scored by its own rewards."""

    env: str = setting("", doc="the verifiers environment (taskset) id, e.g. my-env")
    args: dict[str, Any] = setting(
        factory=dict, doc="the taskset's config fields (verifiers' --env.taskset.* keys)"
    )
    max_tasks: int = setting(10000, ">= 1", "load at most this many tasks (cuts an infinite set)")
    name: str = field(default="verifiers", init=False, repr=False)

    def __post_init__(self) -> None:
        self._splits: dict[str, list[Task]] | None = None

    def validate(self) -> None:
        """Loads the environment and its tasks (ConfigError naming the key, one line)."""
        if self._splits is not None:
            return
        vf = _verifiers()
        if not self.env:
            raise ConfigError("env: name a verifiers environment (taskset id)", "env")
        taskset = self._taskset(vf)
        splits: dict[str, list[Task]] = {split: [] for split in SPLITS}
        for i, task in enumerate(taskset.take(self.max_tasks)):
            if i == 0 and (why := _refusal(vf, taskset, task)) is not None:
                raise ConfigError(
                    f"env: verifiers environment {self.env!r} is not supported: {why}; this"
                    " source takes single-turn text tasks scored from the reply alone",
                    "env",
                )
            split = split_of(f"verifiers:{self.env}", task.key)
            splits[split].append(self._task(vf, task, split, len(splits[split])))
        if not any(splits.values()):
            raise ConfigError(f"env: verifiers environment {self.env!r} has no tasks", "env")
        self._splits = splits

    def _taskset(self, vf):
        from verifiers.v1.utils.loaders import import_taskset

        try:
            import_taskset(self.env)
        except ModuleNotFoundError as e:
            module = self.env.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
            if not (e.__cause__ and getattr(e.__cause__, "name", None) in (module, None)):
                raise ConfigError(
                    f"env: importing verifiers environment {self.env!r}: {e}", "env"
                ) from None
            raise ConfigError(
                f"env: unknown verifiers environment {self.env!r} (no built-in taskset and no"
                f" installed module {module!r})",
                "env",
            ) from None
        try:
            config = vf.taskset_config_type(self.env).model_validate({**self.args, "id": self.env})
            return vf.load_taskset(config)
        except (TypeError, ValueError, AttributeError) as e:  # pydantic's errors are ValueErrors
            lines = [line.strip() for line in str(e).strip().splitlines()]
            raise ConfigError(
                f"args: verifiers environment {self.env!r}: {' '.join(lines[:3])}", "args"
            ) from None

    def _task(self, vf, task, split: str, k: int) -> Task:
        data = task.data
        problem = data.prompt_text
        if data.system_prompt:
            problem = f"{data.system_prompt}\n\n{problem}"
        answer = getattr(data, "answer", "")
        return Task(
            id=f"verifiers/{self.env}/{split}/{k}",
            split=split,
            problem=problem,
            answer="" if answer is None else str(answer),
            scorer=lambda text: _score(vf, task, text),
            source=self.name,
            meta={"scoring": "verifiers", "env": self.env, "key": task.key},
        )

    def item(self, split: str, index: int) -> Task:
        if split not in SPLITS:
            raise ValueError(f"unknown split {split!r}; expected one of {SPLITS}")
        self.validate()
        tasks = self._splits[split]
        if not tasks:
            raise ConfigError(f"verifiers: environment {self.env!r} gives no {split} task")
        return tasks[index % len(tasks)]

    def size(self, split: str) -> int | None:
        self.validate()
        return len(self._splits[split])

    def demonstration(self, task: Task, use_tools: bool) -> None:
        return None
