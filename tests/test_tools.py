"""Tools (`tirl.tools`): Python and shell in one trajectory, dispatched on which block closed.

The rollouts drive the real `Rollout`, the real tokenizer and the real `Sandbox` with
`TapeEngine` (test_protocol_modes.py), a test double of the model only: it "samples" a fixed
tape of ids and stops exactly where `HFEngine` would. The detection tests are the seeded
property tests of test_protocol_modes.py, run over blocks of every tool.
"""

from __future__ import annotations

import asyncio
import random

import pytest
from test_protocol_modes import (
    TapeEngine,
    _check_token_invariants,
    _chunks,
    _detect,
    _free_text,
)

from tirl.config import ConfigError, from_dict
from tirl.protocol import AGENTMATH_TAGS, CIR_FENCES, PROTOCOLS, Boundary
from tirl.protocol.segments import SegmentKind
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.run.config import RunConfig
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.tools import TOOLS, disabled_message, tools_prompt, toolset_protocol
from tirl.tools.shell import format_shell_result

EXACT, STOP = Boundary.EXACT_MATCH, Boundary.STOP_TOKEN
BOTH = ("python", "shell")
ALL = [
    toolset_protocol(p, BOTH).with_boundary(b) for p in PROTOCOLS.values() for b in (EXACT, STOP)
]


def _ids(p):
    return f"{p.name}-{p.boundary.value}"


# ---------------------------------------------------------------- markers and detection


def test_python_is_the_protocols_own_block_and_shell_has_its_own_in_each_protocol():
    fences, tags = toolset_protocol(CIR_FENCES, BOTH), toolset_protocol(AGENTMATH_TAGS, BOTH)
    assert fences.render_code("ls", "shell") == "```bash\nls\n```"
    assert fences.render_code("print(1)") == CIR_FENCES.render_code("print(1)")
    assert tags.render_code("ls", "shell") == "<bash>\nls\n</bash>"
    assert tags.render_code("print(1)") == AGENTMATH_TAGS.render_code("print(1)")
    # the same ```output answer for both tools; server stops: one close per distinct marker
    assert fences.server_stop == ("```",) and tags.server_stop == ("</code>", "</bash>")
    assert fences.closed_call("x ```bash\necho 1\n``` y") == ("shell", "echo 1")
    assert fences.closed_call("```python\nprint(1)\n```") == ("python", "print(1)")
    # a bare protocol (no tool set) still detects Python only: nothing changes for it
    assert CIR_FENCES.closed_call("```bash\necho 1\n```") is None
    assert RolloutSettings().protocol is CIR_FENCES


def _random_block(rng: random.Random) -> tuple[str, str, str]:
    """(tool, code, what it prints)."""
    a, b = rng.randint(2, 999), rng.randint(2, 999)
    if rng.random() < 0.5:
        if rng.random() < 0.5:
            return "python", f"print({a} * {b})", str(a * b)
        return "python", f"x = {a}\nprint(x + {b})", str(a + b)
    if rng.random() < 0.5:
        return "shell", f"echo $(({a} * {b}))", str(a * b)
    return "shell", f"x={a}\necho $((x + {b}))", str(a + b)


def _random_text(rng, protocol):
    """Model text with 0-4 blocks of random tools; in stop-token mode a block may lack its
    marker. Returns the text, every block's (tool, code), those with the marker, and what
    each code prints."""
    exact = protocol.with_boundary(EXACT)
    text, calls, marked, prints = _free_text(rng), [], [], {}
    for _ in range(rng.randint(0, 4)):
        tool, code, printed = _random_block(rng)
        has_marker = rng.random() < 0.6
        writer = protocol if has_marker else exact
        text += writer.render_code(code, tool) + _free_text(rng)
        calls.append((tool, code))
        prints[code] = printed
        if has_marker:
            marked.append((tool, code))
    return text, calls, marked, prints


@pytest.mark.parametrize("max_chunk", [1, 3, 8])
@pytest.mark.parametrize("protocol", ALL, ids=_ids)
def test_every_tools_block_runs_once_when_complete_and_never_half_written(protocol, max_chunk):
    rng = random.Random(3000 + max_chunk)
    seen = set()
    for _ in range(150):
        text, calls, marked, _ = _random_text(rng, protocol)
        expected = calls if protocol.boundary is EXACT else marked
        found = _detect(protocol, _chunks(rng, text, max_chunk), protocol.closed_call)
        assert found == expected
        seen |= {tool for tool, _ in expected}
    assert seen == set(BOTH)  # both tools were exercised
    for _ in range(20):
        tool, code, _ = _random_block(rng)
        block = protocol.render_code(code, tool)
        assert protocol.closed_call(block) == (tool, code)
        assert all(protocol.closed_call(block[:i]) is None for i in range(len(block)))


# ---------------------------------------------------------------- the rollout, end to end


def _rollouts(tokenizer, cases, limits=None):
    """One trajectory per (model text, settings), all in one sandbox."""

    async def main():
        async with Sandbox(limits or SandboxLimits(timeout_s=2.0)) as sandbox:
            out = []
            for text, settings in cases:
                tape = tokenizer(text, add_special_tokens=False)["input_ids"]
                engine = TapeEngine(tape + [tokenizer.eos_token_id], tokenizer.eos_token_id)
                out.append(
                    (await Rollout(engine, tokenizer, sandbox).run("Q:\n", settings), engine)
                )
            return out

    return asyncio.run(main())


def _encoder(tokenizer):
    return lambda text: tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("protocol", [CIR_FENCES, AGENTMATH_TAGS], ids=lambda p: p.name)
def test_python_and_shell_share_the_session_in_one_trajectory(tokenizer, protocol):
    p = toolset_protocol(protocol, BOTH)
    text = (
        "Write it down."
        + p.render_code("open('n.txt', 'w').write(str(6 * 7))\nprint('saved')")
        + " Now the shell."
        + p.render_code("cat n.txt; echo; echo 99 > m.txt; pwd", "shell")
        + " Back to Python."
        + p.render_code("print(open('m.txt').read().strip(), n_missing)")
        + " Once more."
        + p.render_code("echo $(( $(cat n.txt) + 1 )); ls nothing-here", "shell")
        + " The answer is \\boxed{42}."
    )
    settings = RolloutSettings(max_model_tokens=10_000, tool_budget=4, protocol=p, tools=BOTH)
    ((traj, engine),) = _rollouts(tokenizer, [(text, settings)])
    encode = _encoder(tokenizer)
    _check_token_invariants(traj, engine, encode("Q:\n"), encode)

    calls = traj.tool_calls
    assert [(c.tool, c.status) for c in calls] == [
        ("python", "ok"),
        ("shell", "ok"),
        ("python", "error"),  # NameError: n_missing
        ("shell", "error"),  # ls exits 2
    ]
    assert calls[0].output_text == "saved"
    out, workdir = calls[1].output_text.split("\n")
    assert out == "42" and workdir.startswith("/tmp/")  # the file Python wrote, its folder
    assert calls[2].output_text.endswith("NameError: name 'n_missing' is not defined")
    lines = calls[3].output_text.split("\n")
    assert lines[0] == "43" and "nothing-here" in lines[1]  # stderr is shown, in order
    assert lines[-1] == "[exit status 2]"

    # masks: every tool output is a tool segment (mask 0), every sampled id is trained on
    tools = [s for s in traj.segments if s.kind is SegmentKind.TOOL]
    assert [s.text for s in tools] == [p.render_output(c.output_text) for c in calls]
    mask = traj.loss_mask
    pos = 0
    for s in traj.segments:
        assert set(mask[pos : pos + len(s.ids)]) <= {int(s.kind is SegmentKind.MODEL)}
        pos += len(s.ids)
    assert sum(mask) == traj.num_model_tokens == sum(len(o.ids) for o in engine.outputs)
    assert "42" not in "".join(s.text for s in traj.segments[1:2])  # only the tool wrote it

    stats = tool_stats(traj)
    assert stats["by_tool"] == {
        "python": {"num_calls": 2, "num_ok": 1, "num_error": 1},
        "shell": {"num_calls": 2, "num_ok": 1, "num_error": 1},
    }
    assert (stats["num_calls"], stats["num_ok"], stats["num_error"]) == (4, 2, 2)
    agg = aggregate_tool_stats([stats, tool_stats(traj)])
    assert agg["tools/python/calls_mean"] == agg["tools/shell/calls_mean"] == 2.0
    assert agg["tools/shell/ok_share"] == 0.5 and agg["tools/calls_mean"] == 4.0


def test_random_interleavings_of_both_tools_keep_token_invariants(tokenizer):
    rng = random.Random(11)
    cases, expected = [], []
    for i in range(8):
        protocol = ALL[i % len(ALL)]
        text, calls, marked, prints = _random_text(rng, protocol)
        settings = RolloutSettings(
            max_model_tokens=10_000, tool_budget=10, protocol=protocol, tools=BOTH
        )
        cases.append((text, settings))
        expected.append((calls if protocol.boundary is EXACT else marked, prints))
    encode = _encoder(tokenizer)
    ran = set()
    for (traj, engine), (calls, prints) in zip(_rollouts(tokenizer, cases), expected, strict=True):
        _check_token_invariants(traj, engine, encode("Q:\n"), encode)
        assert [(c.tool, c.code) for c in traj.tool_calls] == calls
        assert [(c.status, c.output_text) for c in traj.tool_calls] == [
            ("ok", prints[code]) for _, code in calls
        ]
        ran |= {c.tool for c in traj.tool_calls}
    assert ran == set(BOTH)


def test_a_block_for_a_tool_not_enabled_gets_one_line_and_is_not_run(tokenizer):
    p = toolset_protocol(CIR_FENCES, ["python"])  # the run's default tool set
    assert p.tool_names == ("python", "shell")  # shell's block is known, so it is answered
    assert p.enabled_tools == RolloutSettings(protocol=p).tools == ("python",)
    text = (
        p.render_code("touch ran.txt; echo hi", "shell")
        + " Then Python."
        + p.render_code("import os\nprint(os.path.exists('ran.txt'))")
        + " Done."
    )
    settings = RolloutSettings(max_model_tokens=10_000, tool_budget=1, protocol=p)
    ((traj, _),) = _rollouts(tokenizer, [(text, settings)])
    refused, python = traj.tool_calls
    assert (refused.tool, refused.status) == ("shell", "disabled")
    assert refused.output_text == disabled_message("shell", ["python"])
    assert "\n" not in refused.output_text and "'shell'" in refused.output_text
    # not run (no file), and not charged to the budget of 1: the Python block still ran
    assert (python.status, python.output_text) == ("ok", "False")
    stats = tool_stats(traj)
    assert (stats["num_calls"], stats["num_disabled"], stats["num_skipped"]) == (1, 1, 0)
    assert aggregate_tool_stats([stats])["tools/disabled_mean"] == 1.0


def test_shell_runs_under_the_sessions_limits_and_a_timeout_keeps_the_session(tokenizer):
    p = toolset_protocol(CIR_FENCES, BOTH)
    text = (
        p.render_code("import resource\nx = 5\nprint(resource.getrlimit(resource.RLIMIT_NPROC)[0])")
        + " Then."
        + p.render_code("ulimit -u; tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '", "shell")
        + " Then."
        + p.render_code("sleep 30", "shell")
        + " Then."
        + p.render_code("print(x + 1)")
        + " Done."
    )
    settings = RolloutSettings(max_model_tokens=10_000, tool_budget=4, protocol=p, tools=BOTH)
    limits = SandboxLimits(timeout_s=1.5, max_processes=24)
    ((traj, _),) = _rollouts(tokenizer, [(text, settings)], limits)
    nproc, shell, sleep, after = traj.tool_calls
    assert nproc.output_text == "24"
    assert shell.output_text.split("\n") == ["24", "lo"]  # same rlimit; loopback only
    assert (sleep.status, sleep.output_text) == (
        "timeout",
        "TimeoutError: execution exceeded 1.5 s",
    )
    assert (after.status, after.output_text) == ("ok", "6")  # same session, variables kept


def test_shell_output_is_cut_like_python_output():
    from tirl.sandbox.result import ExecResult, Status

    long = ExecResult(Status.OK, stdout="x" * 1000 + "\n", stderr="tirl-shell-exit 0\n")
    status, text = format_shell_result(long, 100)
    assert status == "ok" and len(text) == 100 and "chars truncated" in text
    failed = ExecResult(Status.OK, stdout="", stderr="tirl-shell-exit 1\n")
    assert format_shell_result(failed, 100) == ("error", "[exit status 1]")


# ---------------------------------------------------------------- the tool set in a config


def test_an_unknown_tool_name_is_one_line_listing_the_registered_ones():
    with pytest.raises(ConfigError) as err:
        from_dict(RunConfig, {"tools": ["python", "bash"]})
    message = str(err.value)
    assert "\n" not in message and "'bash'" in message
    assert all(name in message for name in TOOLS)
    with pytest.raises(ConfigError, match="must list registered tools"):
        RolloutSettings(tools=("pyhton",))


def test_the_default_tool_set_is_python_and_the_prompt_names_the_added_tools():
    assert from_dict(RunConfig, {}).tools == ["python"]
    assert from_dict(RunConfig, {"tools": ["python", "shell"]}).tools == ["python", "shell"]
    with pytest.raises(ConfigError, match="repeat"):
        from_dict(RunConfig, {"tools": ["python", "python"]})
    assert tools_prompt(CIR_FENCES, ["python"]) == ""
    assert "```bash" in tools_prompt(CIR_FENCES, BOTH)
    assert "<bash>" in tools_prompt(AGENTMATH_TAGS, BOTH)


# ---------------------------------------------------------------- docs/extending.md, "A tool"


def test_the_extending_guides_tool_runs_in_a_rollout_and_is_enabled_by_the_config(
    tokenizer, tmp_path
):
    """The recipe's code, exec'd as a module of its own; what it registers is then used
    through the config and a real rollout (no sandbox: the tool needs none)."""
    from test_extending import config_from_recipe, recipe_blocks

    before = set(TOOLS)
    namespace: dict = {"__name__": "extending_a_tool"}
    try:
        for block in recipe_blocks("A tool", "python"):
            exec(compile(block, "<extending.md: A tool>", "exec"), namespace)
        assert set(TOOLS) - before == {"calc"}
        assert config_from_recipe("A tool", tmp_path).tools == ["python", "calc"]

        p = toolset_protocol(AGENTMATH_TAGS, ["python", "calc"])
        text = (
            p.render_code("6 * 7", "calc")
            + " And a bad one."
            + p.render_code("__import__('os')", "calc")
            + " So \\boxed{42}."
        )
        tape = tokenizer(text, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
        engine = TapeEngine(tape, tokenizer.eos_token_id)
        settings = RolloutSettings(max_model_tokens=10_000, protocol=p, tools=("python", "calc"))
        traj = asyncio.run(Rollout(engine, tokenizer, None).run("Q:\n", settings))
        encode = _encoder(tokenizer)
        _check_token_invariants(traj, engine, encode("Q:\n"), encode)
        assert [(c.tool, c.status, c.output_text) for c in traj.tool_calls] == [
            ("calc", "ok", "42"),
            ("calc", "error", "ValueError: only integers and + - * are allowed"),
        ]
        assert traj.segments[2].text == "\n<interpreter>\n42\n</interpreter>\n"
        assert tool_stats(traj)["by_tool"] == {
            "calc": {"num_calls": 2, "num_ok": 1, "num_error": 1}
        }
        assert "<calc>" in tools_prompt(AGENTMATH_TAGS, ["python", "calc"])
    finally:
        TOOLS.unregister("calc")
