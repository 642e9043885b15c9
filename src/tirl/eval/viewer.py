"""A static HTML page for reading trajectories token by token.

In the spirit of CIR's Figure 1: model tokens in blue, interpreter (tool) tokens in orange, the
prompt in grey, and a toggle that greys out every token whose loss mask is 0, so a reader sees
exactly what a gradient step is taken on. Per trajectory the page shows the verdict, the
question, gold and predicted answers, the reward (when one was recorded), the finish reason
and every tool call with its status; a filter keeps the correct, the wrong or the ones whose
code failed. The page is one file: CSS and a few lines of JS inline, no external assets, no
network. Every string from a trajectory is HTML-escaped (model output can contain `<script>`).

Token boundaries need the tokenizer: ids are decoded incrementally into one text piece per id,
and each id becomes one `<span class="tk" data-id=.. data-mask=..>` (subtle separators, and
the id and mask on hover). Without a tokenizer, or when the pieces would not reproduce the
stored segment text exactly, a segment is shown as its stored text in one piece; the colours,
the mask toggle and the filter work the same.

Scope: this module reads and draws. It scores nothing (the verdict is `traj.score` as
evaluation recorded it) and runs no model. `report.py` uses the same trajectory rendering.
"""

from __future__ import annotations

import json
import re
import warnings
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, Trajectory
from tirl.report_kit import escape as _esc

# Meta keys shown in their own row; every other key is listed under "meta".
_KNOWN_META = ("question", "gold", "reward", "variant", "phase")
# Tool-call statuses that are not a failure of the code (see tirl.sandbox.Status).
_NOT_ERRORS = ("ok", "skipped")
FILTERS = (("all", "all"), ("correct", "correct"), ("wrong", "wrong"), ("errors", "tool errors"))


# ---------------------------------------------------------------------------- reading inputs


def load_trajectories(path: str | Path) -> list[Trajectory]:
    """Trajectories from what evaluation writes.

    `path` is a JSONL file of `Trajectory.to_dict()` objects (the quickstart's
    `samples/<variant>_<phase>.jsonl`) or of `tirl eval` sample records (`<benchmark>.samples.jsonl`,
    verdict included), a JSON file holding one such dict or a list of them, or
    a folder: every `*.jsonl` in it, by name, or in its `samples/` subfolder when it is a run
    folder. Lines that do not parse (the half-written last line of a killed run) are skipped
    with one warning per file naming the first; a file that is not text, a JSONL file with no
    trajectory in it (`/etc/passwd`) or a .json file that does not hold trajectories is a
    ValueError naming the file, and in a folder such a file is skipped with one warning.
    """
    path = Path(path)
    if path.is_dir():
        folder = path / "samples" if (path / "samples").is_dir() else path
        trajs = []
        for file in sorted(folder.glob("*.jsonl")):
            try:
                trajs += load_trajectories(file)
            except ValueError as e:
                warnings.warn(f"{e}: skipped", stacklevel=2)
        return trajs
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ValueError(f"{path}: not a text file (not UTF-8)") from None
    if path.suffix == ".json":
        try:
            data = json.loads(text)
            items = data if isinstance(data, list) else [data]
            return [Trajectory.from_dict(d) for d in items]
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            raise ValueError(f"{path}: not a trajectory or a list of them ({e})") from None
    return _jsonl_trajectories(path, text)


def _jsonl_trajectories(path: Path, text: str) -> list[Trajectory]:
    """The trajectories of a JSONL file's lines. One warning for all the lines skipped (not
    one per line: a large file of something else would bury the terminal), and none parsed
    means the file is not a trajectory file at all."""
    trajs, skipped = [], []
    for lineno, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            trajs.append(_trajectory_of(json.loads(line)))
        except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError) as e:
            skipped.append((lineno, e))
    if skipped:
        lineno, why = skipped[0]
        more = f" (and {len(skipped) - 1} more lines)" if len(skipped) > 1 else ""
        if not trajs:
            raise ValueError(f"{path}: not a file of trajectories (line {lineno}: {why}){more}")
        warnings.warn(f"{path}:{lineno}: skipped, not a trajectory ({why}){more}", stacklevel=3)
    return trajs


def _trajectory_of(record: dict) -> Trajectory:
    """A trajectory dict, or a `tirl eval` sample record (the trajectory under "trajectory",
    the verdict beside it, which goes into the trajectory's meta)."""
    if "trajectory" not in record:
        return Trajectory.from_dict(record)
    traj = Trajectory.from_dict(record["trajectory"])
    if "correct" in record and traj.score is None:
        traj.score = Score.from_dict({"reward": float(bool(record["correct"])), **record})
    shown = ("benchmark", "item_id", "sample", "gold", "reward")
    traj.meta.update({k: record[k] for k in shown if k in record})
    return traj


def find_tokenizer(run_dir: str | Path):
    """The tokenizer saved with a run's checkpoints (`<variant>/rl` or `<variant>/sft`), or None.

    Every variant of a quickstart run shares one tokenizer, so the first one found is used.
    """
    run_dir = Path(run_dir)
    for folder in sorted(run_dir.glob("*/rl")) + sorted(run_dir.glob("*/sft")):
        if (folder / "tokenizer_config.json").exists():
            from transformers import AutoTokenizer

            return AutoTokenizer.from_pretrained(str(folder))
    return None


# ---------------------------------------------------------------------------- token pieces


def _incremental_pieces(ids: Sequence[int], decode: Callable[[list[int]], str]) -> list[str]:
    """One text piece per id; joined, they are `decode(ids)`.

    Decoding a short window (the previous piece as context, as vLLM's incremental detokenizer
    does) keeps this linear and lets tokenizers that drop a leading space at the start of a
    decode get it right. An id that ends in the middle of a UTF-8 character gets an empty
    piece; the id that completes the character carries it.
    """
    pieces, prefix, read = [], 0, 0
    for i in range(len(ids)):
        before = decode(list(ids[prefix:read]))
        after = decode(list(ids[prefix : i + 1]))
        # A character is at most 4 bytes: still unfinished after 4 more ids, the bytes are
        # invalid UTF-8 (an untrained model writes such), so emit the U+FFFD and move on.
        complete = not after.endswith("\ufffd") or i + 1 - read > 4
        if len(after) > len(before) and after.startswith(before) and complete:
            pieces.append(after[len(before) :])
            prefix, read = read, i + 1
        else:
            pieces.append("")
    if read < len(ids) and pieces:  # ends inside a character: the rest goes to the last id
        pieces[-1] += decode(list(ids[prefix:]))[len(decode(list(ids[prefix:read]))) :]
    return pieces


def token_pieces(
    ids: Sequence[int], tokenizer, text: str | None = None
) -> list[tuple[str, bool]] | None:
    """[(piece, is_special)] per id, or None when the pieces cannot be trusted.

    A special token (end-of-sequence, padding) is shown by its name and marked special. The
    pieces are checked against `text` (the segment's stored text) when given: they must
    reproduce it exactly, with or without the special tokens' names, else None.
    """
    special = set(tokenizer.all_special_ids)

    def decode(window: list[int]) -> str:
        return tokenizer.decode(window, skip_special_tokens=False)

    raw = _incremental_pieces(ids, decode)
    pieces = [
        (tokenizer.convert_ids_to_tokens(i), True) if i in special else (p, False)
        for i, p in zip(ids, raw)
    ]
    if text:
        plain = "".join(p for p, s in pieces if not s)
        if text not in (plain, "".join(p for p, _ in pieces)):
            return None
    return pieces


# ---------------------------------------------------------------------------- one trajectory


def verdict(traj: Trajectory) -> str:
    """The verdict: "correct", "wrong", or "unscored" when evaluation recorded no correctness."""
    if traj.score is None:
        return "unscored"
    return "correct" if traj.score.correct else "wrong"


def has_tool_errors(traj: Trajectory) -> bool:
    """True when a code block raised, timed out, ran out of memory or killed its session."""
    return any(c.status not in _NOT_ERRORS for c in traj.tool_calls)


def _fmt(value) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def _segment_html(seg: Segment, tokenizer) -> str:
    kind, mask = seg.kind.value, int(seg.kind is SegmentKind.MODEL)
    pieces = token_pieces(seg.ids, tokenizer, seg.text) if tokenizer is not None else None
    if pieces is None:
        body = _esc(seg.text if seg.text else f"[{len(seg.ids)} tokens, no text]")
    else:
        body = "".join(
            f'<span class="tk{" sp" if sp else ""}" data-id="{i}" data-mask="{mask}">'
            f"{_esc(piece)}</span>"
            for i, (piece, sp) in zip(seg.ids, pieces)
        )
    return (
        f'<span class="tok-{kind}" data-kind="{kind}" data-mask="{mask}" '
        f'data-tokens="{len(seg.ids)}">{body}</span>'
    )


def _tool_calls_html(traj: Trajectory) -> str:
    if not traj.tool_calls:
        return ""
    items = []
    for n, call in enumerate(traj.tool_calls, start=1):
        status, css = _esc(call.status), re.sub(r"\W", "_", call.status)
        first_line = call.code.splitlines()[0] if call.code.strip() else ""
        items.append(
            f'<details class="call"><summary><span class="st st-{css}">{status}</span>'
            f" call {n} · {call.duration_s:.2f} s · <code>{_esc(first_line)}</code>"
            f"</summary><pre>{_esc(call.code)}</pre>"
            f'<pre class="out">{_esc(call.output_text)}</pre></details>'
        )
    return f'<div class="calls"><b>tool calls</b>{"".join(items)}</div>'


def trajectory_html(index: int, traj: Trajectory, tokenizer=None) -> str:
    """One trajectory as a `<section class="traj">`: header, facts, tool calls, tokens.

    The section carries `data-verdict`, `data-errors` and `data-variant` for the filter.
    """
    meta = traj.meta
    v = verdict(traj)
    errors = int(has_tool_errors(traj))
    label = " · ".join(_esc(meta[k]) for k in ("variant", "phase") if meta.get(k) is not None)
    rows = [
        ("question", str(meta.get("question", "")).strip() or "(no question recorded)"),
        ("gold", _fmt(meta.get("gold"))),
        ("predicted", _fmt(None if traj.score is None else traj.score.predicted)),
    ]
    facts = [
        f"reward {_fmt(meta.get('reward'))}",
        f"finish {traj.finish_reason}",
        f"prompt {traj.prompt_len} tok",
        f"model {traj.num_model_tokens} tok",
        f"tool {traj.num_tool_tokens} tok",
        f"trained on {sum(traj.loss_mask)} of {len(traj.ids)}",
    ]
    extra = {} if traj.task_id is None else {"task_id": traj.task_id}
    if traj.score is not None:
        extra.update(reason=traj.score.reason, task_reward=traj.score.reward)
    extra.update({k: meta[k] for k in meta if k not in _KNOWN_META})
    if extra:
        rows.append(("meta", json.dumps(extra, default=str, ensure_ascii=False)))
    return "\n".join(
        [
            f'<section class="traj" data-index="{index}" data-verdict="{v}" '
            f'data-errors="{errors}" data-variant="{_esc(meta.get("variant", ""))}">',
            f'<h3>#{index} {label} <span class="verdict v-{v}">{v}</span>'
            + (' <span class="st st-error">tool errors</span>' if errors else "")
            + "</h3>",
            '<table class="facts">'
            + "".join(f"<tr><th>{k}</th><td>{_esc(val)}</td></tr>" for k, val in rows)
            + "</table>",
            f'<div class="nums">{_esc(" · ".join(facts))}</div>',
            _tool_calls_html(traj),
            '<pre class="tokens">'
            + "".join(_segment_html(s, tokenizer) for s in traj.segments)
            + "</pre>",
            "</section>",
        ]
    )


# ---------------------------------------------------------------------------- the page

VIEWER_CSS = """
.tv-controls{position:sticky;top:0;z-index:1;background:#fff;padding:.45em 0;
  border-bottom:1px solid #d0d7de;display:flex;flex-wrap:wrap;gap:.4em 1.1em;align-items:center}
.tv-controls button{font:inherit;padding:1px 9px;border:1px solid #d0d7de;border-radius:12px;
  background:#f6f8fa;cursor:pointer}
.tv-controls button.on{background:#0969da;color:#fff;border-color:#0969da}
.chip{display:inline-block;padding:0 .4em;border-radius:3px;font-family:ui-monospace,monospace}
.traj{border:1px solid #d0d7de;border-radius:6px;padding:.5em .9em;margin:1em 0}
.traj h3{margin:.2em 0;font-size:1.05em}
.traj table.facts{border-collapse:collapse;margin:.3em 0;font-size:.92em}
.traj table.facts th{text-align:left;color:#57606a;font-weight:500;padding:1px 10px 1px 0;
  border:0;background:none;vertical-align:top}
.traj table.facts td{text-align:left;padding:1px 0;border:0;white-space:pre-wrap}
.traj .nums{color:#57606a;font-size:.88em}
.traj pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;padding:.6em;
  border-radius:4px;font:12.5px/1.5 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
.traj .calls{font-size:.9em;margin:.3em 0} .traj .calls pre{margin:.2em 0 .4em}
.traj .calls pre.out{background:#fff8ee}
.verdict{padding:0 .45em;border-radius:3px;font-size:.85em}
.v-correct{background:#dafbe1;color:#1a7f37} .v-wrong{background:#ffebe9;color:#cf222e}
.v-unscored{background:#eaeef2;color:#57606a}
.st{padding:0 .35em;border-radius:3px;font-size:.85em;background:#ffebe9;color:#cf222e}
.st-ok{background:#dafbe1;color:#1a7f37} .st-skipped{background:#eaeef2;color:#57606a}
.tok-model{color:#0b4fb3}
.tok-tool{color:#8a4b00;background:#fff1db}
.tok-prompt{color:#57606a}
.tk:hover{outline:1px solid #8c959f;background:#fff8c5}
.tk:empty{display:inline-block;min-width:3px;height:1em;vertical-align:text-bottom}
.tk.sp{font-size:.8em;border:1px dotted currentColor;border-radius:2px}
body.show-bounds .tk{box-shadow:inset -1px 0 0 rgba(31,35,40,.16)}
body.grey-masked .tok-tool[data-mask="0"],body.grey-masked .tok-prompt[data-mask="0"],
body.grey-masked .tk[data-mask="0"]{color:#aeb4ba;background:#eef0f2}
"""

# Reads and writes its state in the URL fragment (#grey-masked&filter=wrong), so a view can be
# linked to and a headless browser can open the page in a given state.
VIEWER_JS = """
(function () {
  var body = document.body, grey = document.getElementById('grey-masked');
  var bounds = document.getElementById('show-bounds');
  var buttons = document.querySelectorAll('[data-filter]');
  var count = document.getElementById('shown-count');
  var filter = 'all';
  var keep = {
    all: function () { return true; },
    correct: function (t) { return t.dataset.verdict === 'correct'; },
    wrong: function (t) { return t.dataset.verdict === 'wrong'; },
    errors: function (t) { return t.dataset.errors === '1'; }
  };
  function apply() {
    body.classList.toggle('grey-masked', grey.checked);
    body.classList.toggle('show-bounds', bounds.checked);
    var all = document.querySelectorAll('.traj'), shown = 0;
    for (var i = 0; i < all.length; i++) {
      var ok = keep[filter](all[i]);
      all[i].hidden = !ok;
      if (ok) shown++;
    }
    for (var j = 0; j < buttons.length; j++) {
      buttons[j].classList.toggle('on', buttons[j].dataset.filter === filter);
    }
    if (count) count.textContent = shown + ' of ' + all.length + ' shown';
    var state = [];
    if (grey.checked) state.push('grey-masked');
    if (!bounds.checked) state.push('no-bounds');
    if (filter !== 'all') state.push('filter=' + filter);
    try { history.replaceState(null, '', '#' + state.join('&')); } catch (e) {}
  }
  location.hash.slice(1).split('&').forEach(function (part) {
    if (part === 'grey-masked') grey.checked = true;
    if (part === 'no-bounds') bounds.checked = false;
    if (part.indexOf('filter=') === 0 && keep[part.slice(7)]) filter = part.slice(7);
  });
  grey.addEventListener('change', apply);
  bounds.addEventListener('change', apply);
  for (var k = 0; k < buttons.length; k++) {
    buttons[k].addEventListener('click', function () { filter = this.dataset.filter; apply(); });
  }
  document.addEventListener('mouseover', function (e) {
    var t = e.target;
    if (!t.classList || !t.classList.contains('tk') || t.title) return;
    t.title = t.parentNode.dataset.kind + ' token ' + JSON.stringify(t.textContent) +
      ' \\u00b7 id ' + t.dataset.id + ' \\u00b7 loss mask ' + t.dataset.mask;
  });
  apply();
})();
"""


def controls_html(trajs: Sequence[Trajectory]) -> str:
    """The sticky bar: colour legend, mask toggle, boundary toggle, filter buttons."""
    n = {
        "all": len(trajs),
        "correct": sum(verdict(t) == "correct" for t in trajs),
        "wrong": sum(verdict(t) == "wrong" for t in trajs),
        "errors": sum(has_tool_errors(t) for t in trajs),
    }
    buttons = " ".join(
        f'<button type="button" data-filter="{key}">{label} ({n[key]})</button>'
        for key, label in FILTERS
    )
    return "\n".join(
        [
            '<div class="tv-controls">',
            '<span><span class="chip tok-model">model tokens (loss mask 1)</span> '
            '<span class="chip tok-tool">interpreter output (loss mask 0)</span> '
            '<span class="chip tok-prompt">prompt (loss mask 0)</span></span>',
            '<label><input type="checkbox" id="grey-masked"> '
            "grey out tokens masked from the loss</label>",
            '<label><input type="checkbox" id="show-bounds" checked> token boundaries</label>',
            f"<span>show: {buttons}</span>",
            '<span id="shown-count"></span>',
            "</div>",
        ]
    )


def _as_trajectories(trajs: Iterable[Trajectory | dict]) -> list[Trajectory]:
    return [t if isinstance(t, Trajectory) else Trajectory.from_dict(t) for t in trajs]


_PAGE_CSS = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1150px;margin:1.5em auto;
  padding:0 1em;color:#1f2328;line-height:1.45}
h1{margin-bottom:.2em} .summary{color:#57606a}
"""


def render_trajectories(
    trajs: Iterable[Trajectory | dict], title: str = "tirl trajectories", *, tokenizer=None
) -> str:
    """A self-contained HTML page showing `trajs` (Trajectory objects or their dicts).

    With `tokenizer` (the one that made the ids), every token is its own element; without it,
    segments are shown whole.
    """
    trajs = _as_trajectories(trajs)
    summary = (
        f"{len(trajs)} trajectories · "
        f"{sum(verdict(t) == 'correct' for t in trajs)} correct · "
        f"{sum(verdict(t) == 'wrong' for t in trajs)} wrong · "
        f"{sum(has_tool_errors(t) for t in trajs)} with tool errors"
    )
    out = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{_esc(title)}</title>",
        f"<style>{_PAGE_CSS}{VIEWER_CSS}</style></head><body>",
        f"<h1>{_esc(title)}</h1>",
        f'<p class="summary">{_esc(summary)}</p>',
        controls_html(trajs),
        *(trajectory_html(i, t, tokenizer) for i, t in enumerate(trajs, start=1)),
        f"<script>{VIEWER_JS}</script>",
        "</body></html>",
    ]
    return "\n".join(out)


def write_viewer(
    trajs: Iterable[Trajectory | dict],
    path: str | Path,
    title: str = "tirl trajectories",
    *,
    tokenizer=None,
) -> Path:
    """Write `render_trajectories(trajs, title)` to `path` (folders made); returns the path."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(render_trajectories(trajs, title, tokenizer=tokenizer), encoding="utf-8")
    return path
