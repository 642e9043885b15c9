"""Tests for tirl.eval.viewer: escaping, colour classes, per-token loss-mask attributes, loading
what evaluation writes, and the page driven in a real headless Chromium.

Trajectories are real: demonstrations tokenized by the conftest tokenizer with interpreter
output from the real sandbox, and a rollout of the (untrained) tiny model, whose random tokens
split UTF-8 characters and so exercise the incremental decoding.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import replace
from html.parser import HTMLParser

import pytest
from headless_chromium import Tab, chromium, needs_chromium

from tirl.backends.hf import HFEngine
from tirl.eval.report import write_report
from tirl.eval.viewer import (
    find_tokenizer,
    has_tool_errors,
    load_trajectories,
    render_trajectories,
    token_pieces,
    write_viewer,
)
from tirl.protocol.fences import render_code, render_tool_output
from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.rollout.runner import Rollout, RolloutSettings
from tirl.sandbox import Sandbox, format_result
from tirl.synth.arithmetic import ANSWER_TEMPLATE, prompt_for, text_only_texts, to_trajectory
from tirl.tasks.scoring import score_trajectory
from tirl.tasks.sources.arithmetic import ArithmeticSource

XSS = "<script>alert(1)</script>"
CONTROL = "line\r\nnext\x00end\tx <b>"  # a CR the HTML parser would turn into LF, a NUL it drops


def _shown(text: str) -> str:
    """What the page can show of `text`: NUL does not exist in HTML, it becomes U+FFFD."""
    return text.replace("\x00", "\ufffd")


def _control_trajectory(tokenizer) -> Trajectory:
    def seg(kind, text):
        return Segment(kind, tokenizer(text, add_special_tokens=False)["input_ids"], text)

    return Trajectory(
        [
            seg(SegmentKind.PROMPT, "Q:\n"),
            seg(SegmentKind.TOOL, CONTROL),
            seg(SegmentKind.MODEL, CONTROL),
        ]
    )


# ---------------------------------------------------------------------------- trajectories


def _code_trajectory(tokenizer, task, code, result, answer, meta) -> Trajectory:
    output = format_result(result)
    traj = to_trajectory(
        [
            (SegmentKind.PROMPT, prompt_for(task)),
            (SegmentKind.MODEL, render_code(code)),
            (SegmentKind.TOOL, render_tool_output(output)),
            (SegmentKind.MODEL, ANSWER_TEMPLATE.format(answer=answer)),
        ],
        tokenizer,
        meta,
    )
    traj.tool_calls = [ToolCall(code, result.status.value, output, result.duration_s)]
    return traj


@pytest.fixture(scope="module")
def trajs(tokenizer, env) -> list[Trajectory]:
    """Correct (code ran ok), wrong with a tool error and hostile text, wrong text-only, and
    unscored."""
    t1, t2, t3, t4 = env.items("test", 4)
    good_code = f"print({t1.expression})"
    # The model's code prints markup and multi-byte characters, then raises.
    bad_code = f'print("{XSS} é→✓ 😀")\n1/0  # </pre>{XSS}'

    async def run():
        async with Sandbox() as sandbox:
            return await sandbox.run_once(good_code), await sandbox.run_once(bad_code)

    ok, error = asyncio.run(run())
    assert ok.status.value == "ok" and error.status.value == "error"
    correct = _code_trajectory(
        tokenizer,
        t1,
        good_code,
        ok,
        t1.answer,
        {
            "variant": "code",
            "question": t1.question,
            "gold": t1.answer,
            "predicted": t1.answer,
            "correct": True,
            "reward": 1.0,
        },
    )
    wrong = _code_trajectory(
        tokenizer,
        t2,
        bad_code,
        error,
        XSS,
        {
            "variant": "code",
            "question": f"{t2.question} {XSS}",
            "gold": t2.answer,
            "predicted": XSS,
            "correct": False,
            "reward": -1.0,
            "group": 3,
        },
    )
    text = to_trajectory(
        text_only_texts(replace(t3, answer="7")),
        tokenizer,
        {
            "variant": "text",
            "question": t3.question,
            "gold": t3.answer,
            "predicted": "7",
            "correct": False,
        },
    )
    unscored = to_trajectory(text_only_texts(t4), tokenizer, {})
    return [_scored(t) for t in (correct, wrong, text, unscored)]


def _scored(traj: Trajectory) -> Trajectory:
    """The verdict written in the fixtures' meta, as the trajectory's typed score."""
    if "correct" in traj.meta:
        correct, predicted = traj.meta.pop("correct"), traj.meta.pop("predicted")
        traj.score = Score(float(correct), correct, "", predicted)
    return traj


@pytest.fixture(scope="module")
def rollout_trajs(tokenizer, env) -> list[Trajectory]:
    """What the untrained tiny model samples: arbitrary byte-level tokens, scored like eval."""
    from tirl.models.tiny import TinyModelSpec, build_model

    model = build_model(
        tokenizer, TinyModelSpec(hidden_size=64, layers=2, heads=2, max_positions=256), seed=0
    ).eval()
    tasks = env.items("test", 3, start=100)
    settings = RolloutSettings(max_model_tokens=40, temperature=1.0, use_tools=False)

    async def run():
        engine = HFEngine(model, tokenizer.eos_token_id, seed=0)
        out = await Rollout(engine, tokenizer, None).run_many(
            [prompt_for(t) for t in tasks], settings
        )
        engine.close()
        return out

    trajs = asyncio.run(run())
    for traj, task in zip(trajs, tasks):
        score_trajectory(traj, ArithmeticSource().task(task))
        traj.meta["variant"] = "text"
    return trajs


# ---------------------------------------------------------------------------- parsing the page


class _Page(HTMLParser):
    """Per trajectory section: its attributes, segments (kind, mask, text without special
    tokens) and tokens (kind, mask, id, text, special), in document order."""

    def __init__(self, page: str) -> None:
        super().__init__(convert_charrefs=True)
        self.trajs: list[dict] = []
        self.scripts = 0
        self._seg = self._tok = None
        self.feed(page)
        self.close()

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        classes = (a.get("class") or "").split()
        if tag == "script":
            self.scripts += 1
        elif tag == "section" and "traj" in classes:
            self.trajs.append({"attrs": a, "segments": [], "tokens": []})
        elif tag == "span" and "data-kind" in a:
            self._seg = {"kind": a["data-kind"], "mask": int(a["data-mask"]), "text": ""}
            self.trajs[-1]["segments"].append(self._seg)
        elif tag == "span" and "tk" in classes:
            self._tok = {
                "kind": self._seg["kind"],
                "mask": int(a["data-mask"]),
                "id": int(a["data-id"]),
                "text": "",
                "special": "sp" in classes,
            }
            self.trajs[-1]["tokens"].append(self._tok)

    def handle_endtag(self, tag):
        if tag != "span":
            return
        if self._tok is not None:
            self._tok = None
        else:
            self._seg = None

    def handle_data(self, data):
        if self._tok is not None:
            self._tok["text"] += data
        if self._seg is not None and not (self._tok and self._tok["special"]):
            self._seg["text"] += data  # a segment's text leaves out special tokens' names


# ---------------------------------------------------------------------------- unit tests


def test_script_in_model_output_title_and_meta_is_escaped(trajs, tokenizer):
    for tok in (tokenizer, None):
        page = render_trajectories(trajs, title=f"run {XSS}", tokenizer=tok)
        assert page.count("<script") == 1  # the viewer's own, nothing from the data
        assert _Page(page).scripts == 1
        assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page
        assert "</pre><script>" not in page and "&lt;/pre&gt;" in page


def test_model_tool_and_prompt_tokens_have_distinct_colour_classes(trajs, tokenizer):
    page = render_trajectories(trajs, tokenizer=tokenizer)
    for kind in ("model", "tool", "prompt"):
        assert f'class="tok-{kind}"' in page
    colours = {
        kind: re.search(rf"\.tok-{kind}\{{color:(#[0-9a-f]+)", page).group(1)
        for kind in ("model", "tool", "prompt")
    }
    assert len(set(colours.values())) == 3


def test_token_mask_attributes_match_the_trajectory_loss_mask(trajs, rollout_trajs, tokenizer):
    all_trajs = trajs + rollout_trajs
    parsed = _Page(render_trajectories(all_trajs, tokenizer=tokenizer)).trajs
    assert len(parsed) == len(all_trajs)
    for traj, page in zip(all_trajs, parsed):
        assert [t["mask"] for t in page["tokens"]] == traj.loss_mask
        assert [t["id"] for t in page["tokens"]] == traj.ids
        assert sum(t["kind"] == "model" for t in page["tokens"]) == traj.num_model_tokens
        assert sum(t["kind"] == "tool" for t in page["tokens"]) == traj.num_tool_tokens
        assert [s["mask"] for s in page["segments"]] == [
            int(s.kind is SegmentKind.MODEL) for s in traj.segments
        ]


def test_token_pieces_rebuild_each_segment_text_exactly(trajs, rollout_trajs, tokenizer):
    all_trajs = trajs + rollout_trajs
    multibyte = 0
    for traj in all_trajs:
        for seg in traj.segments:
            pieces = token_pieces(seg.ids, tokenizer, seg.text)
            assert pieces is not None and len(pieces) == len(seg.ids)
            assert "".join(p for p, special in pieces if not special) == seg.text
            multibyte += any(p == "" for p, _ in pieces)  # an id inside a UTF-8 character
    assert multibyte  # the emoji and the random tokens did split characters
    # and the page shows the same text per segment
    parsed = _Page(render_trajectories(all_trajs, tokenizer=tokenizer)).trajs
    for traj, page in zip(all_trajs, parsed):
        assert [s["text"] for s in page["segments"]] == [_shown(s.text) for s in traj.segments]


def test_carriage_returns_survive_and_nul_is_shown_as_replacement(tokenizer):
    traj = _control_trajectory(tokenizer)
    for tok in (tokenizer, None):
        page = render_trajectories([traj], tokenizer=tok)
        assert "\r" not in page and "\x00" not in page and "&#13;" in page
        (parsed,) = _Page(page).trajs
        assert [s["text"] for s in parsed["segments"]] == ["Q:\n", _shown(CONTROL), _shown(CONTROL)]


def test_an_eos_token_is_shown_by_name_and_marked_special(trajs, tokenizer):
    pieces = token_pieces(trajs[0].segments[-1].ids, tokenizer, trajs[0].segments[-1].text)
    assert pieces[-1] == (tokenizer.eos_token, True)


def test_pieces_that_do_not_match_the_stored_text_fall_back_to_the_text(trajs, tokenizer):
    ids = trajs[0].segments[1].ids
    odd = Trajectory([Segment(SegmentKind.MODEL, ids, "not what the ids say")])
    assert token_pieces(ids, tokenizer, "not what the ids say") is None
    (page,) = _Page(render_trajectories([odd], tokenizer=tokenizer)).trajs
    assert page["tokens"] == []
    assert page["segments"] == [{"kind": "model", "mask": 1, "text": "not what the ids say"}]


def test_without_a_tokenizer_segments_are_shown_whole_with_their_mask(trajs):
    parsed = _Page(render_trajectories(trajs)).trajs
    for traj, page in zip(trajs, parsed):
        assert page["tokens"] == []
        assert [(s["kind"], s["mask"], s["text"]) for s in page["segments"]] == [
            (s.kind.value, int(s.kind is SegmentKind.MODEL), s.text) for s in traj.segments
        ]


def test_filter_attributes_follow_verdict_and_tool_status(trajs, tokenizer):
    parsed = _Page(render_trajectories(trajs, tokenizer=tokenizer)).trajs
    assert [p["attrs"]["data-verdict"] for p in parsed] == [
        "correct",
        "wrong",
        "wrong",
        "unscored",
    ]
    assert [p["attrs"]["data-errors"] for p in parsed] == ["0", "1", "0", "0"]


def test_metadata_and_tool_calls_are_shown(trajs, tokenizer):
    page = render_trajectories(trajs, tokenizer=tokenizer)
    assert "reward 1 ·" in page and "reward -1 ·" in page and "reward - ·" in page
    assert '<span class="st st-ok">ok</span>' in page
    assert '<span class="st st-error">error</span>' in page
    assert "ZeroDivisionError" in page
    assert "&quot;group&quot;: 3" in page  # unknown meta keys are listed, not dropped


def test_written_page_is_self_contained(trajs, tokenizer, tmp_path):
    path = write_viewer(trajs, tmp_path / "deep" / "viewer.html", "t", tokenizer=tokenizer)
    page = path.read_text(encoding="utf-8")
    assert page.startswith("<!DOCTYPE html>")
    for external in ("http://", "https://", " src=", "<link", "@import", "url("):
        assert external not in page


def test_load_trajectories_reads_a_quickstart_run_folder(trajs, tmp_path):
    samples = tmp_path / "run" / "samples"
    samples.mkdir(parents=True)
    # exactly as Quickstart.evaluate writes them
    for name, chunk in (("code_sft.jsonl", trajs[:2]), ("text_rl.jsonl", trajs[2:])):
        with (samples / name).open("w") as f:
            for traj in chunk:
                f.write(json.dumps(traj.to_dict()) + "\n")
    with (samples / "text_rl.jsonl").open("a") as f:
        f.write('{"segments": [{"kind": "mo')  # a killed run's half-written line

    with pytest.warns(UserWarning, match=r"text_rl.jsonl:3"):
        loaded = load_trajectories(tmp_path / "run")
    assert [t.to_dict() for t in loaded] == [t.to_dict() for t in trajs]
    assert len(load_trajectories(samples / "code_sft.jsonl")) == 2
    (tmp_path / "one.json").write_text(json.dumps([trajs[0].to_dict()]))
    assert load_trajectories(tmp_path / "one.json")[0].ids == trajs[0].ids


PASSWD = "".join(f"user{i}:x:{i}:{i}::/home/user{i}:/bin/sh\n" for i in range(30))


def test_tirl_view_of_a_file_that_holds_no_trajectory_is_one_line(tmp_path, capsys):
    from tirl.cli import main

    (tmp_path / "passwd").write_text(PASSWD)  # what `tirl view /etc/passwd` reads
    (tmp_path / "folder").mkdir()
    (tmp_path / "folder" / "users.jsonl").write_text(PASSWD)
    for path in (tmp_path / "passwd", tmp_path / "folder"):
        assert main(["view", str(path)]) == 2
        out, err = capsys.readouterr()
        assert out == "" and err.count("\n") == 1 and "Warning" not in err, err
        assert "not a file of trajectories (line 1:" in err and "(and 29 more lines)" in err


def test_lines_that_are_not_trajectories_are_one_warning_per_file(trajs, tmp_path, capsys):
    from tirl.cli import main

    path = tmp_path / "mixed.jsonl"
    users = "".join(PASSWD.splitlines(keepends=True)[:3])
    path.write_text(users + json.dumps(trajs[0].to_dict()) + "\n" + users)
    with pytest.warns(UserWarning) as caught:
        assert len(load_trajectories(path)) == 1
    assert len(caught) == 1 and f"{path}:1: skipped" in str(caught[0].message)
    assert main(["view", str(path), "-o", str(tmp_path / "v.html")]) == 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(f"tirl view: warning: {path}:1: skipped")


def test_find_tokenizer_uses_the_checkpoint_tokenizer(trajs, tokenizer, tmp_path):
    assert find_tokenizer(tmp_path) is None
    tokenizer.save_pretrained(tmp_path / "code" / "sft")
    found = find_tokenizer(tmp_path)
    assert render_trajectories(trajs, tokenizer=found) == render_trajectories(
        trajs, tokenizer=tokenizer
    )


def test_report_draws_its_samples_with_the_viewer(trajs, tokenizer, tmp_path):
    out = write_report(
        tmp_path,
        eval_results={},
        metrics_path=tmp_path / "none.jsonl",
        samples=trajs,
        tokenizer=tokenizer,
    )
    parsed = _Page(out["html"].read_text()).trajs
    assert len(parsed) == len(trajs)
    assert [t["mask"] for t in parsed[0]["tokens"]] == trajs[0].loss_mask


# ---------------------------------------------------------------------------- headless Chromium

_TOKEN_STYLES = """[...document.querySelectorAll('.tk')].map(t => {
    const s = getComputedStyle(t);
    return [+t.dataset.mask, s.color, s.backgroundColor];
})"""

_VISIBLE = (
    "[...document.querySelectorAll('.traj')].filter(t => t.offsetParent).map(t => +t.dataset.index)"
)


@needs_chromium
def test_page_in_headless_chromium(trajs, rollout_trajs, tokenizer, tmp_path):
    all_trajs = trajs + rollout_trajs + [_control_trajectory(tokenizer)]
    page = write_viewer(all_trajs, tmp_path / "viewer.html", f"viewer {XSS}", tokenizer=tokenizer)
    with chromium(tmp_path / "profile") as devtools:
        tab = Tab(devtools)
        tab.open(page.as_uri())

        # It rendered: the title (escaped text, not markup) and one section per trajectory.
        assert tab.js("document.title") == f"viewer {XSS}"
        assert tab.js("document.querySelectorAll('.traj').length") == len(all_trajs)
        assert tab.js("document.getElementById('shown-count').textContent") == (
            f"{len(all_trajs)} of {len(all_trajs)} shown"
        )
        for i, traj in enumerate(all_trajs, start=1):
            counts = tab.js(
                f"['model', 'tool', 'prompt'].map(k => document.querySelectorAll("
                f"'.traj[data-index=\"{i}\"] .tok-' + k + ' .tk').length)"
            )
            prompt_tokens = sum(len(s.ids) for s in traj.segments if s.kind is SegmentKind.PROMPT)
            assert counts == [traj.num_model_tokens, traj.num_tool_tokens, prompt_tokens]
            masks = tab.js(
                f"[...document.querySelectorAll('.traj[data-index=\"{i}\"] .tk')]"
                ".map(t => +t.dataset.mask)"
            )
            assert masks == traj.loss_mask
            texts = tab.js(
                f"[...document.querySelectorAll('.traj[data-index=\"{i}\"] [data-kind]')]"
                ".map(s => [...s.querySelectorAll('.tk:not(.sp)')]"
                ".map(t => t.textContent).join(''))"
            )
            assert texts == [_shown(s.text) for s in traj.segments]
        # The model's `<script>` is text on the page, never a script element.
        assert tab.js("document.scripts.length") == 1

        # Hovering a token tells its id and mask.
        tab.hover(".traj[data-index='1'] .tok-model .tk")
        first_model = tab.js(
            "document.querySelector(\".traj[data-index='1'] .tok-model .tk\").title"
        )
        assert "model token" in first_model and "loss mask 1" in first_model

        # The toggle greys out exactly the tokens with loss mask 0 (the mouse is moved off the
        # tokens first, so no token is in its :hover style).
        tab.call("Input.dispatchMouseEvent", type="mouseMoved", x=0, y=0)
        before = tab.js(_TOKEN_STYLES)
        tab.click("#grey-masked")
        assert tab.js("document.getElementById('grey-masked').checked") is True
        after = tab.js(_TOKEN_STYLES)
        assert len(before) == len(after) == sum(len(t.ids) for t in all_trajs)
        assert {m for m, *_ in before} == {0, 1}
        for (mask, *style_before), (_, *style_after) in zip(before, after):
            if mask:
                assert style_after == style_before
            else:
                assert style_after != style_before
        assert tab.js("location.hash") == "#grey-masked"
        tab.click("#grey-masked")
        assert tab.js(_TOKEN_STYLES) == before

        # The filter buttons.
        expected = {
            "wrong": [i for i, t in enumerate(all_trajs, 1) if t.score and not t.score.correct],
            "correct": [i for i, t in enumerate(all_trajs, 1) if t.correct],
            "errors": [i for i, t in enumerate(all_trajs, 1) if has_tool_errors(t)],
            "all": list(range(1, len(all_trajs) + 1)),
        }
        for name, indices in expected.items():
            tab.click(f"[data-filter='{name}']")
            assert tab.js(_VISIBLE) == indices, name

        # The state in the URL fragment is applied on load.
        tab.open("about:blank")
        tab.open(page.as_uri() + "#grey-masked&filter=correct")
        assert tab.js("document.body.classList.contains('grey-masked')") is True
        assert tab.js(_VISIBLE) == expected["correct"]

        # No JS error, no console error, and nothing fetched but the file itself.
        assert tab.errors() == []
        urls = tab.requested_urls()
        assert urls and all(u.startswith(("file:", "about:", "data:")) for u in urls), urls
