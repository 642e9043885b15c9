"""Demonstrations with more than one tool (`tirl.tools`): a `Code` part names its tool.

A demonstration's blocks run with their tools' own runners in one real sandbox session (a bash
step reads the file a Python step wrote), are written as each tool's block of the run's protocol,
and give exactly the trajectory a rollout gives for the same model text: the same ids, the same
segments and the same mask (tool output masked). SFT files and synth records carry the tool per
code step; an unknown tool, or one the run did not enable, is one line naming file and line.
The rollout side is the real `Rollout` driven by `TapeEngine` (test_protocol_modes.py), the
model's test double only.
"""

from __future__ import annotations

import asyncio
import json

import pytest
from test_protocol_modes import TapeEngine

from tirl.config import ConfigError
from tirl.protocol import AGENTMATH_TAGS, CIR_FENCES, Boundary, get_protocol
from tirl.protocol.segments import SegmentKind
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, SandboxLimits
from tirl.synth.formats import load_sft_trajectories, render_parts, sft_record
from tirl.synth.records import Item, Step
from tirl.synth.stages import execute_steps
from tirl.tasks import Code, Think
from tirl.tasks.demos import demo_trajectory, run_demo_codes
from tirl.tasks.prompts import PromptRenderer
from tirl.tasks.sft_file import read_sft_file, read_sft_records
from tirl.tools import toolset_protocol

BOTH = ("python", "shell")
MAX_CHARS = 512
PROBLEM = "What is 6 times 7?"
PARTS = [
    Think("Write it down."),
    Code("open('n.txt', 'w').write(str(6 * 7))\nprint('saved')"),
    Think(" Now read it back with the shell."),
    Code("cat n.txt; echo; wc -c < n.txt", tool="shell"),
    Think(" The answer is \\boxed{42}."),
]
PROTOCOLS = [
    toolset_protocol(p, BOTH).with_boundary(b)
    for p in (CIR_FENCES, AGENTMATH_TAGS)
    for b in (Boundary.EXACT_MATCH, Boundary.STOP_TOKEN)
]


def _demo_and_rollout(tokenizer, protocol):
    """The demonstration of PARTS (its blocks run in the sandbox) and the rollout of a model
    that samples exactly the demonstration's model ids, with the same tools."""
    renderer = PromptRenderer(tokenizer, protocol, chat=False)

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
            (outputs,) = await run_demo_codes(sandbox, [PARTS], MAX_CHARS, names=["t/0"])
            demo = demo_trajectory(renderer, PROBLEM, PARTS, outputs)
            tape = [i for s in demo.segments if s.kind is SegmentKind.MODEL for i in s.ids]
            engine = TapeEngine(tape, tokenizer.eos_token_id)
            settings = RolloutSettings(
                max_model_tokens=10_000,
                tool_budget=4,
                protocol=protocol,
                tools=BOTH,
                max_output_chars=MAX_CHARS,
            )
            prompt = renderer.prompt_ids(PROBLEM)
            return outputs, demo, await Rollout(engine, tokenizer, sandbox).run(prompt, settings)

    return asyncio.run(main())


@pytest.mark.parametrize("protocol", PROTOCOLS, ids=lambda p: f"{p.name}-{p.boundary.value}")
def test_a_python_and_a_bash_step_run_in_one_session_and_read_as_a_rollout(tokenizer, protocol):
    outputs, demo, rollout = _demo_and_rollout(tokenizer, protocol)
    assert outputs == ["saved", "42\n2"]  # the shell read the file the Python step wrote
    bash = protocol.render_code(PARTS[3].source, "shell")
    assert bash.startswith("```bash\n" if protocol.name == "cir_fences" else "<bash>\n")
    assert bash in demo.response_text and protocol.render_output("42\n2") in demo.response_text
    # the demonstration is exactly the trajectory a rollout writes for the same blocks
    assert [(s.kind, s.text) for s in demo.segments] == [(s.kind, s.text) for s in rollout.segments]
    assert demo.ids == rollout.ids and demo.loss_mask == rollout.loss_mask
    assert [(c.tool, c.status, c.output_text) for c in demo.tool_calls] == [
        (c.tool, c.status, c.output_text) for c in rollout.tool_calls
    ]
    assert [c.tool for c in demo.tool_calls] == ["python", "shell"]
    # masks: both tools' outputs are tool segments (0), and nothing else is masked after it
    tools = [s for s in demo.segments if s.kind is SegmentKind.TOOL]
    assert [s.text for s in tools] == [protocol.render_output(o) for o in outputs]
    assert sum(demo.loss_mask) == demo.num_model_tokens
    assert demo.num_tool_tokens == sum(len(s.ids) for s in tools) > 0


def test_a_failing_bash_step_names_its_task_and_an_unknown_tool_fails_before_running():
    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
            with pytest.raises(RuntimeError, match=r"task t/1 failed \(shell block, error\)"):
                await run_demo_codes(
                    sandbox,
                    [[Code("print(1)")], [Code("ls nothing-here", tool="shell")]],
                    512,
                    names=["t/0", "t/1"],
                )
            with pytest.raises(KeyError, match="unknown tool 'perl'; registered: python, shell"):
                await run_demo_codes(sandbox, [[Code("print 1", tool="perl")]], 512)

    asyncio.run(main())


def test_a_block_for_a_tool_the_run_did_not_enable_is_not_rendered(tokenizer):
    parts = [Code("echo 1", "1", tool="shell")]
    for protocol, why in [
        (toolset_protocol(CIR_FENCES, ["python"]), "is not enabled in this run"),
        (CIR_FENCES, "has no block here"),
    ]:
        renderer = PromptRenderer(tokenizer, protocol, chat=False)
        with pytest.raises(ValueError, match=f"tool 'shell': it {why}") as e:
            demo_trajectory(renderer, PROBLEM, parts)
        assert "\n" not in str(e.value)


# ---------------------------------------------------------------- SFT files and synth records


def _write(path, *steps_lists, protocol="cir_fences"):
    rows = [
        {"problem": PROBLEM, "answer": "42", "protocol": protocol, "steps": steps}
        for steps in steps_lists
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


SHELL_STEPS = [
    {"kind": "text", "text": "Count with the shell."},
    {"kind": "code", "text": "echo $((6 * 7))", "tool": "shell", "output": "42"},
    {"kind": "text", "text": "The answer is \\boxed{42}."},
]
OLD_STEPS = [  # written before there were tools: no "tool" key
    {"kind": "code", "text": "print(6 * 7)", "output": "42"},
    {"kind": "text", "text": "\\boxed{42}"},
]


def test_an_sft_row_with_a_shell_step_reads_back_and_renders_in_the_runs_protocol(
    tmp_path, tokenizer
):
    path = _write(tmp_path / "d.jsonl", SHELL_STEPS, OLD_STEPS)
    run = toolset_protocol(get_protocol("cir_fences"), BOTH)
    (_, shell), (_, old) = read_sft_file(path, run)
    assert shell[1] == Code("echo $((6 * 7))", "42", tool="shell")
    assert old[0] == Code("print(6 * 7)", "42", tool="python")  # no key: Python
    traj = demo_trajectory(PromptRenderer(tokenizer, run, chat=False), PROBLEM, shell)
    assert traj.segments[1].text == "Count with the shell.\n```bash\necho $((6 * 7))\n```"
    assert traj.segments[2].kind is SegmentKind.TOOL and traj.tool_calls[0].tool == "shell"
    # the synth loader reads the same file, each record with the tools its steps use
    loaded = load_sft_trajectories(path, tokenizer)
    assert [c.tool for t in loaded for c in t.tool_calls] == ["shell", "python"]
    assert loaded[0].response_text == traj.response_text


@pytest.mark.parametrize(
    "tool, run_tools, message",
    [
        ("perl", BOTH, r"d\.jsonl:2: step 1: unknown tool 'perl' \(registered: python, shell\)$"),
        (None, BOTH, r"d\.jsonl:2: step 1: unknown tool None"),
        (
            "shell",
            ("python",),
            r"d\.jsonl:2: step 1: a shell block, a tool this run does not enable \(tools: python\)$",
        ),
    ],
)
def test_a_row_with_an_unknown_or_disabled_tool_is_one_line(tmp_path, tool, run_tools, message):
    bad = [dict(s) for s in SHELL_STEPS]
    bad[1]["tool"] = tool
    path = _write(tmp_path / "d.jsonl", OLD_STEPS, bad)
    run = toolset_protocol(get_protocol("cir_fences"), run_tools)
    with pytest.raises(ConfigError, match=message) as e:
        read_sft_records(path, run)
    assert "\n" not in str(e.value)
    if tool == "shell":  # a name is no tool set: only registration is checked
        assert [r.parts[1].tool for r in read_sft_records(path, "cir_fences")[1:]] == ["shell"]


def test_old_rows_without_the_key_read_as_python_in_a_python_only_run(tmp_path, tokenizer):
    path = _write(tmp_path / "d.jsonl", OLD_STEPS, protocol="agentmath_tags")
    (rec,) = read_sft_records(path, toolset_protocol(AGENTMATH_TAGS, ["python"]))
    assert rec.parts[0] == Code("print(6 * 7)", "42") and rec.parts[0].tool == "python"
    traj = demo_trajectory(
        PromptRenderer(tokenizer, "agentmath_tags", chat=False), PROBLEM, rec.parts
    )
    assert traj.segments[1].text == "<code>\nprint(6 * 7)\n</code>"


def test_synth_steps_run_with_their_tools_and_the_record_keeps_the_tool(tmp_path):
    steps = [
        Step("text", "Save it."),
        Step("code", "open('n.txt', 'w').write('42')"),
        Step("code", "cat n.txt", tool="shell"),
        Step("text", "\\boxed{42}"),
    ]

    async def main():
        async with Sandbox(SandboxLimits(timeout_s=5.0)) as sandbox:
            return await execute_steps(sandbox, steps, 5.0, MAX_CHARS)

    assert asyncio.run(main()) is None
    assert [(s.real, s.status) for s in steps[1:3]] == [
        ("2", "ok"),
        ("42", "ok"),
    ]  # write() returned 2
    for s in steps[1:3]:
        s.output = s.real
    item = Item("x", PROBLEM, "42", steps=steps, source="in:1")
    rec = sft_record(item, "cir_fences")
    assert [s.get("tool") for s in rec["steps"]] == ["python", "python", "shell", "python"]
    assert "```bash\ncat n.txt\n```\n```output\n42\n```" in rec["text"]
    assert rec["parts"] == [
        {"kind": k, "text": t} for k, t in render_parts(PROBLEM, steps, "cir_fences")
    ]
    assert Item.from_dict(json.loads(json.dumps(item.to_dict()))).steps[2].tool == "shell"
    old = {**item.to_dict(), "steps": [{"kind": "code", "text": "print(1)"}]}
    assert Item.from_dict(old).steps[0].tool == "python"  # stage files from before tools


def test_the_run_config_checks_an_sft_files_tools_against_its_own(tmp_path, capsys):
    """`tirl config` reads an SFT file through the run's protocol with the run's tools: a shell
    step is accepted with `tools: [python, shell]` and refused, in one line, without."""
    from tirl.cli import main

    data = _write(tmp_path / "demos.jsonl", SHELL_STEPS)
    args = ["config", f"sft.data={data}", "variants=[code]"]
    assert main([*args, "tools=[python, shell]"]) == 0, capsys.readouterr().err
    capsys.readouterr()
    assert main(args) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert "demos.jsonl:1" in line and "shell" in line, line


SHELL_REPLY = (
    "<think>Multiply, then add one in the shell.</think>\n<code>\n"
    "open('n.txt', 'w').write(str(6 * 7))\n</code>\n<interpreter>\n2\n</interpreter>\n"
    "<bash>\necho $(( $(cat n.txt) + 1 ))\n</bash>\n<interpreter>\n43\n</interpreter>\n"
    "So the answer is \\boxed{43}."
)


@pytest.mark.parametrize("tools", [["python", "shell"], ["python"]])
def test_synth_reads_a_teachers_shell_blocks_only_when_the_run_enables_shell(
    tmp_path, monkeypatch, tools
):
    """`tirl synth run` with `tools: [python, shell]`: the teacher is told about the shell, its
    <bash> block becomes a shell step run in the item's session (reading the file its Python
    block wrote), and the record renders it as a shell block; without shell the same reply is
    rejected for a block of a tool the run does not enable."""
    from test_synth_pipeline import CASES, ScriptedTeacher, config, rejections

    from tirl.synth.pipeline import run_pipeline

    monkeypatch.setitem(CASES, "shell", (SHELL_REPLY, None, "43"))
    data = tmp_path / "data.jsonl"
    row = {"id": "s", "problem": "Solve it [case:shell]", "solution": "...", "answer": "43"}
    data.write_text(json.dumps(row) + "\n")
    bench = tmp_path / "bench.jsonl"
    bench.write_text(json.dumps({"problem": "Something else entirely.", "answer": "1"}) + "\n")
    with ScriptedTeacher() as teacher:
        cfg = config(teacher.url, bench, f"tools=[{', '.join(tools)}]")
        out = run_pipeline(cfg, str(data), tmp_path / "run")
    (system,) = {json.loads(body)["messages"][0]["content"] for body in teacher.log}
    assert ("<bash>" in system) == ("shell" in tools)
    lines = (out / "trajectories.jsonl").read_text().splitlines()
    if "shell" not in tools:
        assert lines == []
        assert rejections(out) == {("format", "a shell block, a tool this run does not enable"): 1}
        return
    (record,) = map(json.loads, lines)
    assert "<bash>\necho $(( $(cat n.txt) + 1 ))\n</bash>" in record["text"]
    outputs = [p["text"] for p in record["parts"] if p["kind"] == "tool"]
    assert outputs == [
        "\n<interpreter>\n2\n</interpreter>\n",
        "\n<interpreter>\n43\n</interpreter>\n",
    ]
