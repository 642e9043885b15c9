"""tirl's tasks and `tirl synth` demonstrations as the parquet files verl reads.

RL rows (`task_rows`, `export_tasks`; read by verl 0.9.1's `verl.utils.dataset.rl_dataset.
RLHFDataset`, which hands every column of a row to the agent loop as keyword arguments):

    data_source   the task's source ("arithmetic", "races", "dataset", "benchmark"); for the
                  test split, the `data.eval` set's name, so verl's validation metrics
                  (`val-core/<data_source>/...`) are grouped like tirl's `eval/<name>/...`
    prompt        chat messages [system, user]: the protocol's default system prompt (or
                  `prompt.system`; none when it is "") and the problem. verl passes them on as
                  `raw_prompt` and its own loops apply the tokenizer's chat template to them
    ability       "races" for RACES tasks, "math" otherwise
    reward_model  {"style": "rule", "ground_truth": task.answer} (for display: tirl's loop
                  scores with the task's own scorer, from the model's text only)
    extra_info    index (the task's position in the export: the mixture position for train),
                  split, task_id, tirl_task (`task_to_dict(task)` as JSON text), protocol and
                  boundary, prompt_chat and prompt_system (`prompt.chat` / `prompt.system` of
                  the run: the arguments of tirl's `PromptRenderer`)
    agent_name    the registered agent loop that runs the row ("tirl")

`tirl_task` is JSON text, not a nested struct: parquet gives every row of a column one struct
type, the union of all rows' keys, so a mixture of arithmetic and RACES tasks would come back
with each task's meta padded with the other sources' keys set to None (and RACES values of
different types do not fit one struct at all). `task_of_row` reads it back (a row without one
is a one-line ConfigError); `prompt_settings_of_row` gives the renderer's arguments.

Which prompt the agent loop should use: tirl's `PromptRenderer` built from
`prompt_settings_of_row`, on `task.problem`. With a chat template its ids are exactly those of
`apply_chat_template(prompt, add_generation_prompt=True)` (the `prompt` column is the
renderer's `messages`), so either way gives the same tokens there; but only the renderer also
covers plain prompts (a base model without a chat template, tirl's tiny model), uses the same
code as tirl's SFT and evaluation, and knows the turn-end id the loop must stop on.
verl's `RLHFDataset` applies the chat template to `prompt` to filter long prompts: with a
tokenizer that has no template every row fails that check and is dropped, so plain-prompt runs
set `data.filter_overlong_prompts=False`.

SFT rows (`sft_rows`, `export_sft`; read by verl 0.9.1's `verl.utils.dataset.
multiturn_sft_dataset.MultiTurnSFTDataset`, the default dataset of `verl.trainer.sft_trainer`):

    messages   [system, user, assistant, tool, assistant, tool, ..., assistant]
    id, answer, protocol, where   the record's id, reference answer, protocol and file:line

The representation, and why: verl's multi-turn dataset tokenizes each message through the chat
template on its own and sets the loss mask per message: 1 on an assistant message (but 0 on its
generation prompt, `<|im_start|>assistant\\n`), 0 on every other role. It has no way to mask a
span inside one message. tirl's protocols keep the interpreter's output inside the assistant
turn (CIR and AgentMath), so the only form verl masks correctly is to cut that turn at the
interpreter: the model's text up to and including its code block (and the stop marker in
stop-token mode) is an assistant message, the interpreter's output as the protocol renders it
(an "output" fence, or `<interpreter>...</interpreter>`) is a "tool" message, and the model's
continuation is the next assistant message (an empty one when a record ends with an output).
The cuts are tirl's own (`tirl.tasks.demos.demo_segment_texts`, as tirl's SFT makes them), so
the message contents put together are exactly the text tirl trains on, every model token has
loss 1 and every interpreter token loss 0.

The consequence: the chat template wraps each message in its turn markers, so the tokens differ
from tirl's single-turn trajectory at every cut. The model is taught to end its turn
(`<|im_end|>`) right after each code block, and to continue after
`<|im_end|>\\n<|im_start|>tool\\n<output><|im_end|>\\n<|im_start|>assistant\\n` (Qwen2.5 writes
the tool turn as a user turn with `<tool_response>`) instead of right after the output. tirl's
agent loop keeps one assistant turn: exact-match boundaries stop generation at the block's
close, so the extra `<|im_end|>` is never sampled, but after each tool output a model
fine-tuned on these rows continues in a context it was not fine-tuned in. To fine-tune on
tirl's exact single-turn tokens instead, use `tirl train` (sft.data), or a verl dataset named
by `data.custom_cls` that builds ids with `tirl.tasks.demos.demo_trajectory` (not written yet).
Templates that rewrite assistant content (Qwen3 moves `<think>...</think>` into a reasoning
field) change the text further, and verl's per-message vs whole-conversation check does not
see that. Special-token spellings in model or interpreter text (a printed `<|im_end|>`) become
special tokens, since verl tokenizes the rendered template (tirl keeps them as text,
`tirl.protocol.tokens.encode_literal`).

Bad input is a one-line ConfigError naming the file and line, the config key, or the task.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tirl.config import ConfigError, load_config
from tirl.integrations.verl import AGENT_LOOP_NAME
from tirl.protocol import PROTOCOLS, Boundary, Protocol, get_protocol
from tirl.protocol.segments import SegmentKind
from tirl.tasks import Mixture, Task
from tirl.tasks.demos import demo_segment_texts, recorded_outputs
from tirl.tasks.prompts import default_system_prompt
from tirl.tasks.registry import eval_set_tasks
from tirl.tasks.serialize import task_from_dict, task_to_dict
from tirl.tasks.sft_file import SFTRecord, read_sft_records

TASK_KEY = "tirl_task"  # extra_info key of the serialized task
SPLITS = ("train", "test")
ROW_GROUP = 2048  # rows per parquet row group: large SFT exports are written in pieces

# Schemas are explicit, so a column's type never depends on which values a file happens to hold
# (a None prompt_chat stays a nullable bool, an empty file still has every column).


def _arrow():
    import pyarrow as pa  # a dependency of datasets/pandas; imported when a file is written

    return pa


def rl_schema():
    pa = _arrow()
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema(
        [
            ("data_source", pa.string()),
            ("prompt", pa.list_(message)),
            ("ability", pa.string()),
            ("reward_model", pa.struct([("style", pa.string()), ("ground_truth", pa.string())])),
            (
                "extra_info",
                pa.struct(
                    [
                        ("index", pa.int64()),
                        ("split", pa.string()),
                        ("task_id", pa.string()),
                        (TASK_KEY, pa.string()),
                        ("protocol", pa.string()),
                        ("boundary", pa.string()),
                        ("prompt_chat", pa.bool_()),
                        ("prompt_system", pa.string()),
                    ]
                ),
            ),
            ("agent_name", pa.string()),
        ]
    )


def sft_schema():
    pa = _arrow()
    message = pa.struct([("role", pa.string()), ("content", pa.string())])
    return pa.schema(
        [
            ("messages", pa.list_(message)),
            ("id", pa.string()),
            ("answer", pa.string()),
            ("protocol", pa.string()),
            ("where", pa.string()),
        ]
    )


# ---------------------------------------------------------------------------- prompts


@dataclass(frozen=True)
class PromptSettings:
    """What tirl's `PromptRenderer(tokenizer, protocol, system=system, chat=chat)` needs besides
    the tokenizer: `chat` None = the chat template when the tokenizer has one; `system` None =
    the protocol's default system prompt, "" = no system message."""

    protocol: Protocol
    chat: bool | None = None
    system: str | None = None

    def system_message(self) -> str:
        return default_system_prompt(self.protocol) if self.system is None else self.system

    def messages(self, problem: str) -> list[dict[str, str]]:
        """The chat messages of a prompt, as `PromptRenderer.messages` writes them for chat
        prompts (with `chat` False the renderer sends no system text unless one is given; the
        `prompt` column keeps the chat form either way, see the module doc)."""
        system = self.system_message()
        head = [{"role": "system", "content": system}] if system else []
        return [*head, {"role": "user", "content": problem}]

    def renderer(self, tokenizer):
        """tirl's renderer for `tokenizer` (the loop's prompt ids; see the module doc)."""
        from tirl.tasks.prompts import PromptRenderer

        return PromptRenderer(tokenizer, self.protocol, system=self.system, chat=self.chat)


def _protocol(protocol: Protocol | str, boundary: Boundary | str | None = None) -> Protocol:
    if isinstance(protocol, Protocol):
        return protocol if boundary is None else protocol.with_boundary(boundary)
    if protocol not in PROTOCOLS:
        raise ConfigError(
            f"unknown protocol {protocol!r} (known: {', '.join(sorted(PROTOCOLS))})", "protocol"
        )
    return get_protocol(protocol, boundary or Boundary.EXACT_MATCH)


# ---------------------------------------------------------------------------- RL rows


def ability_of(task: Task) -> str:
    return "races" if task.meta.get("scoring") == "races" else "math"


def task_rows(
    tasks: Sequence[Task],
    protocol: Protocol | str | PromptSettings,
    agent_name: str = AGENT_LOOP_NAME,
    data_source: str | None = None,
    first_index: int = 0,
) -> list[dict[str, Any]]:
    """verl RL rows of `tasks` (the schema is in the module doc). `protocol`: the run's
    protocol (default prompt settings) or its full `PromptSettings`; `data_source`: one name for
    every row (None: each task's source); `first_index`: `extra_info.index` of the first row.
    A task whose scorer cannot be serialized is a ConfigError naming it: no row is dropped."""
    settings = (
        protocol if isinstance(protocol, PromptSettings) else PromptSettings(_protocol(protocol))
    )
    rows = []
    for i, task in enumerate(tasks):
        try:
            serialized = json.dumps(task_to_dict(task), ensure_ascii=False)
        except ValueError as e:  # names the task
            raise ConfigError(f"cannot export {e}") from None
        rows.append(
            {
                "data_source": data_source or task.source or "tirl",
                "prompt": settings.messages(task.problem),
                "ability": ability_of(task),
                "reward_model": {"style": "rule", "ground_truth": str(task.answer)},
                "extra_info": {
                    "index": first_index + i,
                    "split": task.split,
                    "task_id": task.id,
                    TASK_KEY: serialized,
                    "protocol": settings.protocol.name,
                    "boundary": settings.protocol.boundary.value,
                    "prompt_chat": settings.chat,
                    "prompt_system": settings.system,
                },
                "agent_name": agent_name,
            }
        )
    return rows


def task_of_row(extra_info: Any) -> Task:
    """The task a verl row carries (`extra_info.tirl_task`), scorer included. A row without
    one, or with one that does not parse, is a one-line ConfigError."""
    index = extra_info.get("index", "?") if isinstance(extra_info, Mapping) else "?"
    if not isinstance(extra_info, Mapping) or extra_info.get(TASK_KEY) is None:
        raise ConfigError(
            f"verl row {index}: no extra_info.{TASK_KEY} (a serialized tirl task); export the"
            " data with `tirl verl data`"
        )
    data = extra_info[TASK_KEY]
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as e:
            raise ConfigError(
                f"verl row {index}: extra_info.{TASK_KEY} is not JSON ({e.msg} at column {e.colno})"
            ) from None
    try:
        return task_from_dict(data)
    except ValueError as e:
        raise ConfigError(f"verl row {index}: extra_info.{TASK_KEY}: {e}") from None


def same_prompt(row: PromptSettings, run: PromptSettings) -> bool:
    """Whether a row exported with `row` suits a run with `run`: the same protocol and boundary,
    chat and system. A row does not record the run's tools (`tirl.tools`), so the protocols are
    compared without their tool blocks."""
    strip = lambda p: (p.protocol.with_blocks(()), p.chat, p.system)  # noqa: E731
    return strip(row) == strip(run)


def prompt_settings_of_row(extra_info: Mapping[str, Any]) -> PromptSettings:
    """The prompt settings a row was exported with (see `PromptSettings.renderer`)."""
    missing = [k for k in ("protocol", "boundary") if not extra_info.get(k)]
    if missing:
        raise ConfigError(
            f"verl row {extra_info.get('index', '?')}: extra_info lacks {', '.join(missing)};"
            " export the data with `tirl verl data`"
        )
    try:
        boundary = Boundary(extra_info["boundary"])
    except ValueError:
        raise ConfigError(
            f"verl row {extra_info.get('index', '?')}: unknown boundary"
            f" {extra_info['boundary']!r} (known: {', '.join(b.value for b in Boundary)})"
        ) from None
    return PromptSettings(
        _protocol(extra_info["protocol"], boundary),
        extra_info.get("prompt_chat"),
        extra_info.get("prompt_system"),
    )


# ---------------------------------------------------------------------------- drawing tasks


@dataclass(frozen=True)
class TaskSet:
    """Tasks to export, with the data_source their rows get (None: each task's source) and the
    export position of the first."""

    tasks: list[Task]
    data_source: str | None = None
    first_index: int = 0


def run_config(path: str | Path, overrides: Sequence[str] = ()):
    """A tirl run config (`tirl train`'s), checked as `tirl train` checks it."""
    from tirl.run.config import RunConfig

    return load_config(RunConfig, path, overrides)


def config_task_sets(cfg, split: str, n: int | None, start: int = 0) -> list[TaskSet]:
    """The tasks a run config names: train = `n` items of the `data.train` mixture from
    position `start` (deterministic: `Mixture` and every source are); test = every `data.eval`
    set (its own `items`, at most `n` each), each set's rows with its name as data_source."""
    mixture = Mixture.from_entries(cfg.data.train, "data.train", cfg.seed)
    if split == "train":
        if n is None:
            raise ConfigError("say how many train tasks to export (--n N)", "n")
        return [TaskSet(mixture.items("train", n, start), None, start)]
    sets, first = [], 0
    for name, tasks in eval_set_tasks(cfg.data.eval, mixture, cfg.seed).items():
        tasks = tasks if n is None else tasks[:n]
        sets.append(TaskSet(tasks, name, first))
        first += len(tasks)
    return sets


def entries_task_sets(
    entries: Sequence[Mapping[str, Any]], split: str, n: int, start: int = 0, seed: int = 0
) -> list[TaskSet]:
    """`n` items of `split` of a mixture of source entries (as `data.train` writes them)."""
    mixture = Mixture.from_entries(entries, "data", seed)
    return [TaskSet(mixture.items(split, n, start), None, start)]


# ---------------------------------------------------------------------------- writing


def check_out_path(out_path: str | Path, force: bool) -> Path:
    """A `.parquet` path (verl's RLHFDataset reads no other name) that exists only if `force`."""
    out = Path(out_path)
    if out.suffix != ".parquet":
        raise ConfigError(f"{out}: the output must be a .parquet file (verl reads no other name)")
    if out.is_dir():
        raise ConfigError(f"{out}: is a folder; give a file name")
    if out.exists() and not force:
        raise ConfigError(f"{out}: exists; pass --force to replace it")
    return out


def write_parquet(rows: Iterable[dict[str, Any]], out_path: Path, schema) -> int:
    """Write `rows` with `schema`, `ROW_GROUP` rows at a time, atomically (`tirl.files`: a
    crash leaves the old file or the new one, never a part). Returns the row count."""
    import pyarrow.parquet as pq

    from tirl.files import replacing

    pa = _arrow()
    count = 0
    with replacing(out_path) as tmp:
        with pq.ParquetWriter(tmp, schema) as writer:
            batch: list[dict[str, Any]] = []
            for row in rows:
                batch.append(row)
                if len(batch) == ROW_GROUP:
                    writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                    count, batch = count + len(batch), []
            if batch or count == 0:
                writer.write_table(pa.Table.from_pylist(batch, schema=schema))
                count += len(batch)
    return count


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    """The rows of a parquet file as Python dicts (for checks and tests)."""
    import pyarrow.parquet as pq

    return pq.read_table(path).to_pylist()


@dataclass(frozen=True)
class ExportSummary:
    """What an export wrote: the file, its row count, and rows per data_source."""

    path: Path
    rows: int
    by_source: dict[str, int]

    def line(self) -> str:
        parts = ", ".join(f"{name} {count}" for name, count in self.by_source.items())
        return f"wrote {self.rows} rows to {self.path} ({parts})"


def export_tasks(
    config: str | Path | Sequence[Mapping[str, Any]],
    split: str,
    n: int | None,
    out_path: str | Path,
    protocol: Protocol | str | None = None,
    *,
    overrides: Sequence[str] = (),
    start: int = 0,
    force: bool = False,
    agent_name: str = AGENT_LOOP_NAME,
) -> ExportSummary:
    """Write verl RL rows of a config's tasks to `out_path` (see `config_task_sets`).

    `config`: a tirl run config file (its `protocol` section, `prompt.*`, `seed`, with
    `overrides`) or a list of source entries (a mixture; `protocol` then defaults to
    cir_fences, the seed to 0). `protocol` given overrides the config's. An existing
    `out_path` is replaced only with `force`."""
    if split not in SPLITS:
        raise ConfigError(f"unknown split {split!r}; expected one of {', '.join(SPLITS)}", "split")
    out = check_out_path(out_path, force)
    if isinstance(config, (str, Path)):
        cfg = run_config(config, overrides)
        settings = PromptSettings(
            _protocol(protocol or cfg.protocol.name, cfg.protocol.boundary),
            cfg.prompt.chat,
            cfg.prompt.system,
        )
        sets = config_task_sets(cfg, split, n, start)
    else:
        if n is None:
            raise ConfigError("say how many tasks to export (n)", "n")
        settings = PromptSettings(_protocol(protocol or "cir_fences"))
        sets = entries_task_sets(config, split, n, start)
    rows: list[dict[str, Any]] = []
    for s in sets:
        rows += task_rows(s.tasks, settings, agent_name, s.data_source, s.first_index)
    count = write_parquet(rows, out, rl_schema())
    return ExportSummary(out, count, dict(Counter(r["data_source"] for r in rows)))


# ---------------------------------------------------------------------------- SFT rows


def record_messages(
    record: SFTRecord, boundary: Boundary | str = Boundary.EXACT_MATCH, system: str | None = None
) -> list[dict[str, str]]:
    """verl multi-turn messages of one synth record (the representation is in the module doc):
    [system, user, then assistant / tool alternating, ending with assistant]. `system` None is
    the protocol's default system prompt, "" none."""
    settings = PromptSettings(_protocol(record.protocol, boundary), chat=True, system=system)
    messages = settings.messages(record.problem)
    segments = demo_segment_texts(settings.protocol, record.parts, recorded_outputs(record.parts))
    for kind, text in segments:
        role = "tool" if kind is SegmentKind.TOOL else "assistant"
        messages.append({"role": role, "content": text})
    if messages[-1]["role"] != "assistant":  # ends with an output: the turn then ends (eos)
        messages.append({"role": "assistant", "content": ""})
    return messages


def _sft_row(record: SFTRecord, boundary: Boundary | str, system: str | None) -> dict[str, Any]:
    return {
        "messages": record_messages(record, boundary, system),
        "id": record.id,
        "answer": record.answer,
        "protocol": record.protocol,
        "where": record.where,
    }


def sft_rows(
    path: str | Path,
    protocol: Protocol | str | None = None,
    boundary: Boundary | str = Boundary.EXACT_MATCH,
    system: str | None = None,
) -> list[dict[str, Any]]:
    """verl multi-turn SFT rows of a `tirl synth run` / `tirl synth races` file, read through
    `tirl.tasks.sft_file` (a bad line is a ConfigError naming file:line; a record in another
    protocol than `protocol` too; None accepts each record's own)."""
    name = protocol.name if isinstance(protocol, Protocol) else protocol
    return [_sft_row(r, boundary, system) for r in read_sft_records(path, name)]


def _iter_sft_rows(
    records: Iterable[SFTRecord], boundary: Boundary | str, system: str | None
) -> Iterator[dict[str, Any]]:
    for record in records:
        yield _sft_row(record, boundary, system)


def export_sft(
    path: str | Path,
    out_path: str | Path,
    protocol: Protocol | str | None = None,
    *,
    boundary: Boundary | str = Boundary.EXACT_MATCH,
    system: str | None = None,
    force: bool = False,
) -> ExportSummary:
    """Write verl multi-turn SFT rows of a synth file to `out_path` (see `sft_rows`)."""
    out = check_out_path(out_path, force)
    name = protocol.name if isinstance(protocol, Protocol) else protocol
    records = read_sft_records(path, name)
    count = write_parquet(_iter_sft_rows(records, boundary, system), out, sft_schema())
    return ExportSummary(out, count, dict(Counter(r.protocol for r in records)))
