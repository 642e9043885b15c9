"""Protocol shapes (`tirl.protocol.Shape`): a tool names its blocks by a word per shape and every
protocol writes them, so a plugin's tool works in every protocol, a plugin's protocol runs every
tool, and synthesis reads and writes any registered tool's blocks.

The plugin is tests/data/shapes_plugin.py (a tool, `query`, whose word is `sql`, and a protocol,
`result_fences`), loaded the way a config's `plugins:` file is; what it registers is removed
after each test, so the registries stay as tirl ships them. Rollouts drive the real `Rollout`
with `TapeEngine` (test_protocol_modes.py), a test double of the model only.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest
from test_protocol_modes import TapeEngine, _check_token_invariants

from tirl.config import ConfigError
from tirl.plugins import load_plugins
from tirl.protocol import (
    AGENTMATH_TAGS,
    CIR_FENCES,
    PROTOCOLS,
    Boundary,
    Protocol,
    Shape,
    get_protocol,
)
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.synth.config import SynthConfig
from tirl.synth.formats import FormatError, parse_solution, render_parts, sft_record
from tirl.synth.prompts import CODEIFY_SYSTEM, codeify_messages, self_correct_messages
from tirl.synth.records import Item
from tirl.synth.stages import Context, code_limits
from tirl.tools import TOOLS, toolset_protocol
from tirl.tools.base import Tool, register_tool

PLUGIN = Path(__file__).parent / "data" / "shapes_plugin.py"
EXACT, STOP = Boundary.EXACT_MATCH, Boundary.STOP_TOKEN
WITH_QUERY = ["python", "query"]


@pytest.fixture
def plugin():
    """The plugin loaded as `plugins: [shapes_plugin.py]` loads it; unloaded afterwards."""
    load_plugins([PLUGIN.name], PLUGIN.parent)
    yield
    TOOLS.unregister("query")
    PROTOCOLS.unregister("result_fences")
    sys.modules.pop(f"tirl_plugin_{PLUGIN.stem}", None)  # the next load registers afresh


def _encode(tokenizer):
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


def _rollout(tokenizer, text, protocol, tools, sandbox=False):
    async def main():
        tape = _encode(tokenizer)(text) + [tokenizer.eos_token_id]
        engine = TapeEngine(tape, tokenizer.eos_token_id)
        settings = RolloutSettings(max_model_tokens=10_000, protocol=protocol, tools=tools)
        if not sandbox:
            return await Rollout(engine, tokenizer, None).run("Q:\n", settings), engine
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as box:
            return await Rollout(engine, tokenizer, box).run("Q:\n", settings), engine

    return asyncio.run(main())


# ---------------------------------------------------------------- the built-in strings, pinned


@pytest.mark.parametrize("boundary", [EXACT, STOP])
def test_the_built_in_protocols_write_the_shell_block_exactly_as_before(boundary):
    fences = toolset_protocol(CIR_FENCES.with_boundary(boundary), ["python", "shell"])
    tags = toolset_protocol(AGENTMATH_TAGS.with_boundary(boundary), ["python", "shell"])
    stop = boundary is STOP
    assert fences.render_code("ls", "shell") == "```bash\nls\n```" + "\n```output" * stop
    assert tags.render_code("ls", "shell") == "<bash>\nls\n</bash>" + "\n<interpreter>" * stop
    assert fences.render_code("1", "python") == "```python\n1\n```" + "\n```output" * stop
    assert tags.render_code("1", "python") == "<code>\n1\n</code>" + "\n<interpreter>" * stop
    assert (CIR_FENCES.shape, AGENTMATH_TAGS.shape) == (Shape.FENCES, Shape.TAGS)


# ---------------------------------------------------------------- a plugin's tool


def test_a_plugins_tool_names_no_protocol_and_runs_under_fences_and_tags(plugin, tokenizer):
    assert "cir_fences" not in PLUGIN.read_text() and "agentmath_tags" not in PLUGIN.read_text()
    for base, open_, close in [
        (CIR_FENCES, "```sql\n", "\n```"),
        (AGENTMATH_TAGS, "<sql>\n", "\n</sql>"),
    ]:
        for boundary in (EXACT, STOP):
            p = toolset_protocol(base.with_boundary(boundary), WITH_QUERY)
            assert p.block_for("query").open == open_ and p.block_for("query").close == close
            text = p.render_code("SELECT 6 * 7", "query") + " So \\boxed{42}."
            traj, engine = _rollout(tokenizer, text, p, tuple(WITH_QUERY))
            _check_token_invariants(traj, engine, _encode(tokenizer)("Q:\n"), _encode(tokenizer))
            assert [(c.tool, c.status, c.output_text) for c in traj.tool_calls] == [
                ("query", "ok", "42")
            ]
            assert f"{open_}SELECT 6 * 7{close}" in traj.segments[1].text
        assert f"{open_.strip()} and {close.strip()}" in TOOLS["query"].prompt_line(base)


TEACHER = (
    "<think>Ask the database.</think>\n<sql>\nSELECT 6 * 7\n</sql>\n<interpreter>\n42\n"
    "</interpreter>\nThen add one:\n```sqlite\nSELECT 42 + 1\n```\n```output\n43\n```\n"
    "So the answer is \\boxed{43}."
)


def test_synthesis_reads_writes_and_announces_a_plugins_tool(plugin):
    steps = parse_solution(TEACHER, WITH_QUERY)  # its word in tags, its alias in fences
    assert [(s.kind, s.tool, s.text, s.simulated) for s in steps if s.kind == "code"] == [
        ("code", "query", "SELECT 6 * 7", "42"),
        ("code", "query", "SELECT 42 + 1", "43"),
    ]
    with pytest.raises(FormatError) as err:
        parse_solution(TEACHER, ["python"])
    assert err.value.reason == "a query block, a tool this run does not enable"
    for s in steps:
        if s.kind == "code":
            s.output = s.simulated
    item = Item("x", "What is 6 * 7 + 1?", "43", steps=steps, source="in:1")
    rec = sft_record(item, "cir_fences")
    assert "```sql\nSELECT 6 * 7\n```\n```output\n42\n```" in rec["text"]
    assert "```sql\nSELECT 42 + 1\n```\n```output\n43\n```" in rec["text"]
    assert [s.get("tool") for s in rec["steps"] if s["kind"] == "code"] == ["query", "query"]
    tags = "".join(t for _, t in render_parts(item.problem, steps, "agentmath_tags"))
    assert "<sql>\nSELECT 42 + 1\n</sql>\n<interpreter>\n43\n</interpreter>" in tags

    note = "\nSQLite is there too: <sql>SELECT 6 * 7</sql> shows 42."
    for messages in (
        codeify_messages("p", "cot", WITH_QUERY),
        self_correct_messages("p", "so far", WITH_QUERY),
    ):
        assert messages[0]["content"].endswith(note)
    assert codeify_messages("p", "cot")[0]["content"] == CODEIFY_SYSTEM  # only enabled tools

    # Not Python source: only its line count is limited (an AST of SQL would be a syntax error).
    cfg = SynthConfig()
    assert asyncio.run(code_limits(item, Context(cfg))).reason is None
    steps[1].text = "\n".join(["SELECT 1"] * (cfg.limits.max_lines + 1))
    assert asyncio.run(code_limits(item, Context(cfg))).reason == "too many lines"


# ---------------------------------------------------------------- a plugin's protocol


def test_a_plugins_protocol_writes_the_shell_tools_block_from_its_shape(plugin, tokenizer):
    p = toolset_protocol(get_protocol("result_fences"), ["python", "shell"])
    assert p.render_code("ls", "shell") == "```bash\nls\n```"
    assert p.render_code("print(1)") == "```py\nprint(1)\n```"  # its own Python block
    assert p.render_output("x") == "\n```result\nx\n```\n"
    stop = toolset_protocol(get_protocol("result_fences", STOP), ["python", "shell"])
    assert stop.render_code("ls", "shell") == "```bash\nls\n```\n```result"
    text = (
        p.render_code("open('n.txt', 'w').write('41')")
        + " Then "
        + p.render_code("echo $(( $(cat n.txt) + 1 ))", "shell")
        + " So \\boxed{42}."
    )
    traj, _ = _rollout(tokenizer, text, p, ("python", "shell"), sandbox=True)
    assert [(c.tool, c.status, c.output_text) for c in traj.tool_calls] == [
        ("python", "ok", "2"),
        ("shell", "ok", "42"),
    ]
    assert traj.segments[4].text == "\n```result\n42\n```\n"


def test_a_protocol_without_a_shape_has_only_its_python_block():
    bare = Protocol("bare", "[[\n", "\n]]", output_open="\n{{\n", output_close="}}")
    assert toolset_protocol(bare, ["python"]).tool_names == ("python",)
    with pytest.raises(ConfigError) as err:
        toolset_protocol(bare, ["python", "shell"])
    assert "'shell' has no block in protocol 'bare' (no shape" in str(err.value)


# ---------------------------------------------------------------- docs/extending.md, "A protocol"


def test_the_extending_guides_protocol_runs_the_shell_tool_and_is_named_by_the_config(tmp_path):
    from test_extending import config_from_recipe, recipe_blocks

    namespace: dict = {"__name__": "extending_a_protocol"}
    try:
        for block in recipe_blocks("A protocol", "python"):
            exec(compile(block, "<extending.md: A protocol>", "exec"), namespace)
        cfg = config_from_recipe("A protocol", tmp_path)
        assert (cfg.protocol.name, cfg.tools) == ("result_tags", ["python", "shell"])
        p = toolset_protocol(get_protocol("result_tags"), cfg.tools)
        assert p.render_code("ls", "shell") + p.render_output("a") == (
            "<bash>\nls\n</bash>\n<result>\na\n</result>\n"
        )
        assert p.closed_call("<python>\nprint(1)\n</python>") == ("python", "print(1)")
    finally:
        PROTOCOLS.unregister("result_tags")


# ---------------------------------------------------------------- mistakes, refused early


@pytest.mark.parametrize(
    ("attrs", "expected"),
    [
        ({"words": {"fence": "x"}}, "'fence' is not a protocol shape"),
        ({"words": {Shape.TAGS: " x"}}, "' x' is not a word"),
        ({"aliases": {Shape.FENCES: "xs"}}, "aliases map a shape to a tuple"),
    ],
)
def test_a_tool_with_a_bad_word_is_refused_when_it_registers(attrs, expected):
    cls = type("Bad", (Tool,), {**attrs, "run": lambda self, code, ctx: None})
    with pytest.raises(TypeError, match=expected):
        register_tool("bad")(cls)
    assert "bad" not in TOOLS


def test_two_tools_claiming_one_word_make_teacher_text_an_error(plugin):
    cls = type("Shadow", (Tool,), {"words": {Shape.TAGS: "sql"}, "run": lambda s, c, x: None})
    register_tool("shadow")(cls)
    try:
        with pytest.raises(ValueError, match="'query' and tool 'shadow' both use 'sql'"):
            parse_solution(TEACHER, WITH_QUERY)
    finally:
        TOOLS.unregister("shadow")
