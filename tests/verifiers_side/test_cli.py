"""`vf-eval tirl-verifiers ...` as its users run it: the command docs/integrations.md shows, read
from the doc and run as written (only the port of the chat server differs), against a chat
server on 127.0.0.1, under the network guard of tests/openenv_side/site (every connection or
name lookup outside loopback is refused and logged; the log must stay empty)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

from tirl.tasks import make_source

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "integrations.md"
GUARD_SITE = ROOT / "tests" / "openenv_side" / "site"
DOC_URL = "http://127.0.0.1:8000/v1"
VF_EVAL = str(Path(sys.executable).with_name("vf-eval"))


def documented_command() -> list[str]:
    """The documented `vf-eval` command, its continuation lines joined, split as a shell does."""
    text = DOC.read_text(encoding="utf-8")
    match = re.search(r"^ *(vf-eval tirl-verifiers (?:.*\\\n)*.*)$", text, re.MULTILINE)
    assert match, "docs/integrations.md shows no vf-eval command"
    return shlex.split(match.group(1).replace("\\\n", " "))


def vf_eval(args: list[str], cwd: Path, guard_log: Path) -> subprocess.CompletedProcess:
    path = [str(GUARD_SITE), os.environ.get("PYTHONPATH", "")]
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(p for p in path if p),
        "TIRL_NETGUARD_LOG": str(guard_log),
        "COLUMNS": "200",
    }
    guard_log.write_text("")
    return subprocess.run(
        [VF_EVAL, *args], cwd=cwd, env=env, capture_output=True, text=True, timeout=600
    )


def test_the_documented_vf_eval_command_runs_as_written(scripted_server, tmp_path):
    command = documented_command()
    assert command[0] == "vf-eval" and "--no-push" in command
    assert command[command.index("--client.base-url") + 1] == DOC_URL
    args = [scripted_server.base_url if a == DOC_URL else a for a in command[1:]]
    entry = json.loads(args[args.index("--env.taskset.source") + 1])
    count = int(args[args.index("-n") + 1])
    source = make_source(entry, "test")
    gold = {t.problem: t.answer for t in (source.item("test", i) for i in range(count))}

    def reply(messages: list[dict]) -> str:
        """Code first (run in tirl's sandbox), then the reference answer."""
        problem = next(m["content"] for m in messages if m["role"] == "user")
        if "```output" not in messages[-1]["content"]:
            return "Let me check.\n```python\nprint(6 * 7)\n```"
        return f"The sandbox works.\n{gold[problem]}"

    scripted_server.reply = reply
    guard_log = tmp_path / "netguard.log"
    run = vf_eval(args, tmp_path, guard_log)
    assert run.returncode == 0, run.stderr[-5000:]
    assert guard_log.read_text() == "", guard_log.read_text()
    assert Path(f"{guard_log}.active").read_text().split(), "the guard did not run in vf-eval"
    (traces,) = tmp_path.glob("outputs/*/traces.jsonl")  # --no-push: the results stay here
    episodes = [json.loads(line) for line in traces.read_text().splitlines()]
    assert len(episodes) == count
    for episode in episodes:
        assert episode["ok"], episode["errors"]
        (trace,) = episode["traces"]
        assert trace["agent"]["config"]["harness"]["python"] is True
        assert trace["agent"]["config"]["runtime"]["type"] == "subprocess"
        contents = [node["message"]["content"] for node in trace["nodes"]]
        assert "```output\n42\n```" in contents  # the block ran in tirl's sandbox
        assert trace["rewards"]["tirl_reward"]["score"] == 1.0
    assert len(scripted_server.requests) == 2 * count
    assert {r["model"] for r in scripted_server.requests} == {"MODEL"}


def test_a_bad_source_is_a_config_error_not_a_traceback(tmp_path):
    args = [
        "tirl-verifiers", "--env.taskset.source", '{"source": "racez"}', "-n", "1",
        "-m", "MODEL", "--client.base-url", DOC_URL, "--no-push",
    ]  # fmt: skip
    run = vf_eval(args, tmp_path, tmp_path / "netguard.log")
    assert run.returncode != 0
    output = run.stdout + run.stderr
    assert "Traceback" not in output, output[-3000:]
    assert "unknown task source 'racez'" in output, output[-3000:]
    assert (tmp_path / "netguard.log").read_text() == ""
