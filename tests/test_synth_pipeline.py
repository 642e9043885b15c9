"""`tirl synth run` end to end against a scripted teacher: a real aiohttp server on 127.0.0.1.

The teacher answers deterministically from the request: the problem carries a `[case:NAME]`
tag, and each case is a crafted trajectory that one stage must keep or reject (bad code, a
judge that disagrees, deep or long code, missing or wrong answers, a contaminated problem, an
unreadable format, a failing block that the teacher fixes or fails to fix). The tests read the
stage files and the report, and the server's request log shows what was sent.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path

import pytest
from aiohttp import web

from tirl.cli import main
from tirl.config import load_config
from tirl.synth.client import RequestBudgetExceeded
from tirl.synth.config import SynthConfig
from tirl.synth.pipeline import run_pipeline
from tirl.synth.report import stage_stats

CONTAMINATED = "Compute the sum of all positive divisors of the number two thousand and twenty four"

# case -> (codeify reply, self-correction reply or None, reference answer)
CASES = {
    "good": (
        "<think>Multiply the numbers.</think>\n<code>\nprint(123 * 457)\n</code>\n"
        "<interpreter>\n56211\n</interpreter>\nSo the answer is \\boxed{56211}.",
        None,
        "56211",
    ),
    "fences": (  # CIR fences and a ```py block: format correction turns them into tags
        "Multiply.\n```py\nprint(21 * 2)\n```\n```output\n42\n```\nThe answer is \\boxed{42}.",
        None,
        "42",
    ),
    "replaced": (  # the simulated output is wrong, the reasoning uses the real value
        "<code>\nprint(6 * 7)\n</code>\n<interpreter>\n40\n</interpreter>\nIt is 42: \\boxed{42}.",
        None,
        "42",
    ),
    "mismatch": (  # the reasoning uses the wrong simulated value; the judge disagrees
        "<code>\nprint(9 * 11)\n</code>\n<interpreter>\n100\n</interpreter>\nSo \\boxed{100}.",
        None,
        "100",
    ),
    "unclosed": ("<code>\nprint(1)\nThe answer is \\boxed{1}.", None, "1"),
    "nocode": ("One plus two is three, so \\boxed{3}.", None, "3"),
    "fixable": (
        "<code>\nprint(undefined_x * 6)\n</code>\n<interpreter>\n42\n</interpreter>\n\\boxed{42}",
        "The name was never defined; define it first.\n<code>\nundefined_x = 7\n"
        "print(undefined_x * 6)\n</code>\n<interpreter>\n42\n</interpreter>\nThus \\boxed{42}.",
        "42",
    ),
    "unfixable": (
        "<code>\nprint(1 / 0)\n</code>\n<interpreter>\ninf\n</interpreter>\n\\boxed{1}",
        "Try again.\n<code>\nprint(2 / 0)\n</code>\nStill \\boxed{1}.",
        "1",
    ),
    "deep": (
        "<code>\nprint(1+1+1+1+1+1+1+1+1+1)\n</code>\n<interpreter>\n10\n</interpreter>\n\\boxed{10}",
        None,
        "10",
    ),
    "long": (
        "<code>\n" + "\n".join(f"a{i} = {i}" for i in range(12)) + "\nprint(a11)\n</code>\n"
        "<interpreter>\n11\n</interpreter>\n\\boxed{11}",
        None,
        "11",
    ),
    "noanswer": (
        "<code>\nprint(2 + 3)\n</code>\n<interpreter>\n5\n</interpreter>\nDone.",
        None,
        "5",
    ),
    "wrong": (
        "<code>\nprint(2 + 3)\n</code>\n<interpreter>\n5\n</interpreter>\n\\boxed{6}",
        None,
        "5",
    ),
}
EXPECTED_REJECTIONS = {
    ("decontaminate", "contaminated"): 1,
    ("format", "unclosed or unknown block"): 1,
    ("format", "no code block"): 1,
    ("self_correct", "correction still fails"): 1,
    ("feedback_alignment", "reasoning disagrees with output"): 1,
    ("code_limits", "AST too deep"): 1,
    ("code_limits", "too many lines"): 1,
    ("answer_check", "missing answer"): 1,
    ("answer_check", "wrong answer"): 1,
}
KEPT = {"good", "fences", "replaced", "fixable"}


def _case(text: str) -> str:
    return text.split("[case:", 1)[1].split("]", 1)[0] if "[case:" in text else "good"


class ScriptedTeacher:
    """A deterministic OpenAI-compatible chat server in a background thread, on 127.0.0.1."""

    def __init__(self, chat: bool = True, fail_first: int = 0) -> None:
        self.log: list[str] = []  # every request body answered with 200, canonical JSON
        self.chat = chat
        self.fail_first = fail_first  # answer this many requests with 503 first

    async def handle(self, request: web.Request) -> web.Response:
        body = await request.json()
        if self.fail_first > 0:
            self.fail_first -= 1
            return web.json_response({"error": "busy"}, status=503)
        self.log.append(json.dumps(body, sort_keys=True))
        messages = body["messages"]
        system, user = messages[0]["content"], messages[-1]["content"]
        codeify, fix, _ = CASES[_case(user)]
        if system.startswith("You check"):  # the judge
            n = user.count("Block ")
            verdict = "DISAGREE" if _case(user) == "mismatch" else "AGREE"
            text = "\n".join(f"{i}: {verdict}" for i in range(1, n + 1))
        elif system.startswith("A tool-integrated solution stopped"):
            text = fix
        else:
            text = codeify
        usage = {"prompt_tokens": len(user) // 4, "completion_tokens": len(text) // 4}
        choice = {"index": 0, "message": {"role": "assistant", "content": text}}
        return web.json_response({"choices": [choice], "usage": usage})

    async def models(self, request: web.Request) -> web.Response:
        return web.json_response({"data": [{"id": "scripted"}]})

    def __enter__(self) -> ScriptedTeacher:
        ready = threading.Event()

        def serve() -> None:
            self.loop = asyncio.new_event_loop()
            app = web.Application()
            app.router.add_get("/v1/models", self.models)
            if self.chat:
                app.router.add_post("/v1/chat/completions", self.handle)
            runner = web.AppRunner(app)
            self.loop.run_until_complete(runner.setup())
            site = web.TCPSite(runner, "127.0.0.1", 0)
            self.loop.run_until_complete(site.start())
            self.url = f"http://127.0.0.1:{site._server.sockets[0].getsockname()[1]}"
            ready.set()
            self.loop.run_forever()
            self.loop.run_until_complete(runner.cleanup())

        self.thread = threading.Thread(target=serve, daemon=True)
        self.thread.start()
        assert ready.wait(10)
        return self

    def __exit__(self, *exc) -> None:
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(10)


def write_inputs(tmp: Path) -> tuple[Path, Path]:
    records = [
        {
            "id": name,
            "problem": f"Solve problem {name} carefully [case:{name}]",
            "solution": "...",
            "answer": answer,
        }
        for name, (_, _, answer) in CASES.items()
    ]
    records.append(
        {
            "id": "contaminated",
            "problem": CONTAMINATED + " [case:good]",
            "solution": "...",
            "answer": "56211",
        }
    )
    data = tmp / "data.jsonl"
    data.write_text("".join(json.dumps(r) + "\n" for r in records))
    bench = tmp / "bench.jsonl"
    bench.write_text(json.dumps({"problem": CONTAMINATED + ".", "answer": "4"}) + "\n")
    return data, bench


def config(url: str, bench: Path, *extra: str) -> SynthConfig:
    return load_config(
        SynthConfig,
        None,
        [
            f"teacher.url={url}",
            f"decontam.benchmarks=[{bench}]",
            "decontam.n=8",
            "limits.max_ast_depth=8",
            "limits.max_lines=10",
            "sandbox.preload=[math]",
            "teacher.backoff_s=0.01",
            "concurrency=4",
            *extra,
        ],
    )


def rejections(out: Path) -> dict[tuple[str, str], int]:
    return {(s["stage"], reason): n for s in stage_stats(out) for reason, n in s["reasons"].items()}


def kept_ids(out: Path) -> list[str]:
    return [
        json.loads(line)["id"] for line in (out / "trajectories.jsonl").read_text().splitlines()
    ]


def test_each_stage_keeps_good_and_rejects_crafted_bad_trajectories(tmp_path):
    data, bench = write_inputs(tmp_path)
    with ScriptedTeacher() as teacher:
        out = run_pipeline(config(teacher.url, bench), str(data), tmp_path / "run")
    assert rejections(out) == EXPECTED_REJECTIONS
    assert set(kept_ids(out)) == KEPT
    for s in stage_stats(out):  # one line per item: in = out + rejected, always
        assert s["in"] == s["out"] + s["rejected"], s
    notes = {s["stage"]: s["notes"] for s in stage_stats(out)}
    assert notes["execute"]["sent_to_self_correct"] == 2
    assert notes["self_correct"]["corrected"] == 1
    assert notes["feedback_alignment"]["judged_blocks"] == 2  # only where outputs differed
    # 12 codeify + 2 self-correction + 2 judge requests, none sent twice
    assert len(teacher.log) == 16 == len(set(teacher.log))

    records = {
        json.loads(line)["id"]: json.loads(line)
        for line in (out / "trajectories.jsonl").read_text().splitlines()
    }
    fences = records["fences"]["text"]
    assert "<code>\nprint(21 * 2)\n</code>" in fences and "```" not in fences
    replaced = [p for p in records["replaced"]["parts"] if p["kind"] == "tool"]
    assert replaced == [{"kind": "tool", "text": "\n<interpreter>\n42\n</interpreter>\n"}]
    fixed = records["fixable"]["parts"]
    assert "NameError" in fixed[2]["text"] and fixed[2]["kind"] == "tool"
    assert "never defined" in fixed[3]["text"]  # the diagnosis follows the real error

    report = (out / "report.md").read_text()
    assert "| stage | in | out | rejected | rejections by reason | notes |" in report
    assert "| decontaminate | 13 | 12 | 1 | contaminated: 1 |" in report
    assert "<table>" in (out / "report.html").read_text()

    # A rerun of the finished run sends nothing and changes nothing.
    before = (out / "trajectories.jsonl").read_text()
    with ScriptedTeacher() as again:
        run_pipeline(config(again.url, bench), str(data), out, resume=True)
    assert again.log == [] and (out / "trajectories.jsonl").read_text() == before


def test_interrupted_run_resumes_without_loss_duplicates_or_repeated_requests(tmp_path):
    data, bench = write_inputs(tmp_path)
    with ScriptedTeacher() as teacher:
        cfg = config(teacher.url, bench)
        for budget in (3, 5):  # stops in codeify, then again later
            with pytest.raises(RequestBudgetExceeded):
                run_pipeline(cfg, str(data), tmp_path / "run", resume=True, max_requests=budget)
        out = run_pipeline(cfg, str(data), tmp_path / "run", resume=True)
    ids = kept_ids(out)
    assert sorted(ids) == sorted(KEPT) and len(ids) == len(set(ids))
    assert rejections(out) == EXPECTED_REJECTIONS
    assert len(teacher.log) == len(set(teacher.log)) == 16  # nothing asked twice
    for path in (out / "stages").glob("*.jsonl"):  # no id recorded twice in any stage
        rows = [json.loads(line)["id"] for line in path.read_text().splitlines()]
        assert len(rows) == len(set(rows)), path


def test_retries_503_and_falls_back_to_completions(tmp_path):
    data, bench = write_inputs(tmp_path)
    with ScriptedTeacher(fail_first=2) as teacher:
        out = run_pipeline(config(teacher.url, bench), str(data), tmp_path / "run")
    assert set(kept_ids(out)) == KEPT and len(teacher.log) == 16

    async def ask(url: str) -> tuple[str, object]:
        from tirl.synth.client import ChatClient

        cfg = SynthConfig().teacher
        cfg.url, cfg.max_retries = url, 0
        client = ChatClient(cfg, tmp_path / "cache.jsonl")
        try:
            return await client.chat([{"role": "user", "content": "hi"}]), client.usage
        finally:
            await client.aclose()

    with ScriptedTeacher(chat=False) as no_chat:  # a 404 on chat -> /v1/completions, also 404
        from tirl.synth.client import TeacherError

        with pytest.raises(TeacherError, match="/v1/completions: HTTP 404"):
            asyncio.run(ask(no_chat.url))


def test_cli_run_and_report(tmp_path, capsys):
    data, bench = write_inputs(tmp_path)
    cfg_file = tmp_path / "synth.yaml"
    cfg_file.write_text(
        "decontam: {n: 8, benchmarks: [" + str(bench) + "]}\n"
        "limits: {max_ast_depth: 8, max_lines: 10}\nsandbox: {preload: [math]}\n"
        "teacher: {price_prompt_per_1k: 1.0, price_completion_per_1k: 2.0}\n"
    )
    with ScriptedTeacher() as teacher:
        args = ["synth", "run", str(cfg_file), f"teacher.url={teacher.url}"]
        assert main([*args, "--input", str(data), "--out", str(tmp_path / "run")]) == 0
        assert main([*args, "--input", str(data), "--out", str(tmp_path / "run")]) == 2
        assert "--resume" in capsys.readouterr().err
    assert main(["synth", "report", str(tmp_path / "run")]) == 0
    printed = capsys.readouterr().out
    assert "| answer_check | 6 | 4 | 2 | missing answer: 1; wrong answer: 1 |" in printed
    assert "| teacher | 14 |" in printed  # requests, tokens and a non-zero cost
    assert json.loads((tmp_path / "run" / "stats.json").read_text())["usage"][0]["cost"] > 0


def test_without_self_correction_unexecutable_code_is_rejected(tmp_path):
    data, bench = write_inputs(tmp_path)
    with ScriptedTeacher() as teacher:
        cfg = config(teacher.url, bench, "stages.self_correct=false")
        out = run_pipeline(cfg, str(data), tmp_path / "run")
    assert rejections(out)[("execute", "unexecutable code")] == 2
    assert set(kept_ids(out)) == KEPT - {"fixable"}
    assert len(teacher.log) == 12 + 2  # codeify and judge only
