"""Tests for tirl.eval.report: files are written, numbers and escaping reach the HTML, a run
with missing or no metrics still gets a report, and the page works in a real headless Chromium
(tests/headless_chromium.py) without a console error."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest
from headless_chromium import Tab, chromium, needs_chromium

from tirl.eval.report import (
    format_summary_table,
    read_metrics,
    summary_rows,
    write_report,
)
from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"

EVAL = {
    "code": {
        "sft": {
            "eval/accuracy": 0.81,
            "eval/avg@k": 0.81,
            "eval/k": 1,
            "eval/n_items": 200,
            "tools/calls_mean": 1.25,
            "tools/ok_share": 0.9,
            "tools/error_share": 0.1,
            "length/model_tokens_mean": 35.5,
            "length/tool_tokens_mean": 8.0,
        },
        "rl": {
            "eval/accuracy": 0.93,
            "eval/avg@k": 0.93,
            "eval/k": 1,
            "eval/n_items": 200,
            "tools/calls_mean": 1.0,
            "tools/ok_share": 0.975,
            "tools/error_share": 0.025,
            "length/model_tokens_mean": 31.2,
            "length/tool_tokens_mean": 8.0,
        },
    },
    "text": {
        "sft": {"eval/accuracy": 0.5, "eval/n_items": 200, "length/model_tokens_mean": 60.0},
        "rl": {"eval/accuracy": 0.615, "eval/n_items": 200, "length/model_tokens_mean": 52.4},
    },
}


def _metrics_lines() -> list[dict]:
    lines = []
    for variant in ("code", "text"):
        for step in range(5):
            lines.append(
                {"variant": variant, "phase": "sft", "step": step, "train/loss": 2.0 - 0.3 * step}
            )
        for step in range(30):
            line = {
                "variant": variant,
                "phase": "rl",
                "step": step,
                "train/reward_mean": -0.5 + step / 30,
                "train/accuracy": 0.3 + step / 60,
                "length/model_tokens_mean": 40 - step / 3,
                "actor/clip_frac": 0.01,
            }
            if variant == "code":
                line |= {
                    "tools/calls_mean": 1 + step / 30,
                    "tools/ok_share": 0.8 + step / 300,
                    "rl/budget": 2 if step < 10 else 3 if step < 20 else 4,
                }
            lines.append(line)
    return lines


def _write_metrics(path: Path, lines: list[dict]) -> Path:
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


def _samples() -> list[Trajectory]:
    code = Trajectory(
        segments=[
            Segment(SegmentKind.PROMPT, [1, 2, 3], "What is 6*7?\n"),
            Segment(SegmentKind.MODEL, [4, 5, 6, 7], "```python\nprint(6*7)\n```\n"),
            Segment(SegmentKind.TOOL, [8, 9], "```output\n<script>alert(1)</script>\n```\n"),
            Segment(SegmentKind.MODEL, [10, 11], "The answer is \\boxed{42}."),
        ],
        tool_calls=[ToolCall("print(6*7)", "ok", "<script>alert(1)</script>\n")],
        meta={"variant": "code", "question": "What is 6*7?", "gold": "42"},
        score=Score(1.0, True, "", "42"),
    )
    text = Trajectory(
        segments=[
            Segment(SegmentKind.PROMPT, [1, 2], "What is 6*7?\n"),
            Segment(SegmentKind.MODEL, [3, 4, 5], "6*7 = 41, so \\boxed{41}."),
        ],
        meta={"variant": "text", "question": "What is 6*7?", "gold": "42"},
        score=Score(0.0, False, "", "41"),
    )
    return [code, text]


def test_write_report_writes_valid_pngs_markdown_and_html(tmp_path):
    metrics = _write_metrics(tmp_path / "metrics.jsonl", _metrics_lines())
    out = write_report(
        tmp_path, eval_results=EVAL, metrics_path=metrics, samples=_samples(), config={"seed": 0}
    )

    assert set(out) == {"markdown", "html", "plots"}
    pngs = sorted(p.name for p in out["plots"].glob("*.png"))
    assert pngs == sorted(
        [
            "eval_accuracy.png",
            "rl_reward_accuracy.png",
            "sft_loss.png",
            "response_length.png",
            "tool_calls.png",
            "code_pass_rate.png",
            "rl_health.png",
        ]
    )
    for png in out["plots"].glob("*.png"):
        data = png.read_bytes()
        assert len(data) > 1000 and data.startswith(PNG_MAGIC), png

    md = out["markdown"].read_text()
    assert "| variant | phase | accuracy |" in md
    assert "| code | rl | 0.930 |" in md
    assert "![RL: response length in model tokens](plots/response_length.png)" in md
    assert "code 0.930 vs text 0.615" in md
    # The sample's ```python fence must not close the block it is shown in.
    assert "````text\n```python" in md


def test_html_is_self_contained_escaped_and_has_the_mask_toggle(tmp_path):
    metrics = _write_metrics(tmp_path / "metrics.jsonl", _metrics_lines())
    page = write_report(tmp_path, eval_results=EVAL, metrics_path=metrics, samples=_samples())[
        "html"
    ]
    html = page.read_text()

    for number in ("0.930", "0.615", "0.975", "31.2", "200"):
        assert number in html
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "<script>alert" not in html
    assert 'class="tok-model"' in html and 'class="tok-tool"' in html
    assert 'type="checkbox"' in html and "grey out tokens masked from the loss" in html
    assert html.count("data:image/png;base64,") == 7
    # No external assets: nothing is fetched from anywhere.
    assert "http://" not in html and "https://" not in html and 'src="plots/' not in html


def test_empty_metrics_file_still_writes_a_report(tmp_path):
    metrics = tmp_path / "metrics.jsonl"
    metrics.write_text("")
    out = write_report(tmp_path, eval_results=EVAL, metrics_path=metrics)

    assert out["markdown"].exists() and out["html"].exists()
    # Only the eval bar chart has data.
    assert [p.name for p in out["plots"].glob("*.png")] == ["eval_accuracy.png"]
    assert "| code | rl | 0.930 |" in out["markdown"].read_text()


def test_nothing_at_all_still_writes_a_report(tmp_path):
    out = write_report(tmp_path, eval_results={}, metrics_path=tmp_path / "missing.jsonl")
    md = out["markdown"].read_text()
    assert "No eval results." in md and "nothing to plot" in md
    assert list(out["plots"].glob("*.png")) == []


def test_single_step_and_missing_metrics_skip_only_empty_figures(tmp_path):
    metrics = _write_metrics(
        tmp_path / "metrics.jsonl",
        [{"variant": "code", "phase": "rl", "step": 0, "train/reward_mean": 0.2}],
    )
    out = write_report(tmp_path, eval_results={}, metrics_path=metrics)
    assert [p.name for p in out["plots"].glob("*.png")] == ["rl_reward_accuracy.png"]
    assert out["plots"].joinpath("rl_reward_accuracy.png").read_bytes().startswith(PNG_MAGIC)


def test_trajectory_dicts_are_accepted_like_objects(tmp_path):
    metrics = _write_metrics(tmp_path / "metrics.jsonl", [])
    samples = [t.to_dict() for t in _samples()]
    html = write_report(tmp_path, eval_results={}, metrics_path=metrics, samples=samples)["html"]
    assert "&lt;script&gt;" in html.read_text()


def test_truncated_last_line_is_skipped_with_a_warning(tmp_path):
    path = tmp_path / "metrics.jsonl"
    path.write_text(json.dumps({"variant": "code", "phase": "rl", "step": 0}) + '\n{"variant": "co')
    with pytest.warns(UserWarning, match=r"metrics.jsonl:2"):
        records = read_metrics(path)
    assert len(records) == 1


def test_non_numeric_metric_values_are_ignored(tmp_path):
    metrics = _write_metrics(
        tmp_path / "metrics.jsonl",
        [
            {"variant": "code", "phase": "sft", "step": 0, "train/loss": None},
            {"variant": "code", "phase": "sft", "step": 1, "train/loss": "nan"},
            {"variant": "code", "phase": "sft", "step": 2, "train/loss": float("nan")},
        ],
    )
    out = write_report(tmp_path, eval_results={}, metrics_path=metrics)
    assert list(out["plots"].glob("*.png")) == []


def test_summary_rows_order_and_missing_values():
    rows = summary_rows(
        {"text": {"rl": {}}, "code": {"rl": {"eval/accuracy": 0.9}, "before_sft": {}}}
    )
    assert [(r["variant"], r["phase"]) for r in rows] == [
        ("code", "before_sft"),
        ("code", "rl"),
        ("text", "rl"),
    ]
    assert rows[1]["accuracy"] == 0.9 and rows[1]["calls"] is None


def test_terminal_table_is_aligned_and_drops_empty_columns():
    table = format_summary_table(summary_rows(EVAL))
    lines = table.splitlines()
    assert lines[0].split()[:3] == ["variant", "phase", "accuracy"]
    assert "last" not in lines[0]  # not a terminal column
    assert len({len(line) for line in lines[:3]}) == 1  # header, rule and a full row line up
    assert "0.930" in table and "-" in lines[-1]  # text has no tool calls
    assert format_summary_table([]) == "(no eval results)"


# ---------------------------------------------------------------------------- headless Chromium


def _tokenized(traj: Trajectory, tokenizer) -> Trajectory:
    """`traj` with each segment's ids made by `tokenizer` from its text, so the report shows
    every token as its own element, as it does for a real run."""
    segments = [
        Segment(s.kind, tokenizer(s.text, add_special_tokens=False)["input_ids"], s.text)
        for s in traj.segments
    ]
    return replace(traj, segments=segments)


@needs_chromium
def test_report_in_headless_chromium_has_no_console_error(tokenizer, tmp_path):
    metrics = _write_metrics(tmp_path / "metrics.jsonl", _metrics_lines())
    samples = [_tokenized(t, tokenizer) for t in _samples()]
    page = write_report(
        tmp_path / "run",
        eval_results=EVAL,
        metrics_path=metrics,
        samples=samples,
        config={"seed": 0},
        tokenizer=tokenizer,
    )["html"]
    empty = write_report(tmp_path / "empty", eval_results={}, metrics_path=tmp_path / "no.jsonl")[
        "html"
    ]
    with chromium(tmp_path / "profile") as devtools:
        tab = Tab(devtools)
        tab.open(page.as_uri())

        # Every plot is an image the browser decoded, and both samples are drawn token by token.
        images = tab.js("[...document.images].map(i => [i.complete, i.naturalWidth > 0])")
        assert images == [[True, True]] * 7
        assert tab.js("document.querySelectorAll('.traj').length") == len(samples)
        masks = tab.js("[...document.querySelectorAll('.tk')].map(t => +t.dataset.mask)")
        assert masks == [m for t in samples for m in t.loss_mask]
        # The sample's `<script>` is text on the page; the one script is the viewer's.
        assert tab.js("document.scripts.length") == 1

        # The viewer's controls work inside the report.
        tab.click("#grey-masked")
        assert tab.js("document.body.classList.contains('grey-masked')") is True
        tab.click("[data-filter='correct']")
        assert tab.js(
            "[...document.querySelectorAll('.traj')].filter(t => t.offsetParent).length"
        ) == sum(t.correct for t in samples)

        # A report with nothing in it (no script, no plot) loads as well.
        tab.open(empty.as_uri())
        assert "No eval results." in tab.js("document.body.textContent")

        # No JS error, no console error, and nothing fetched but the files themselves.
        assert tab.errors() == []
        urls = tab.requested_urls()
        assert len(urls) >= 2 and all(u.startswith(("file:", "data:")) for u in urls), urls
