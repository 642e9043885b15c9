"""The mechanics every report writer shares: escaping, markdown and HTML tables, one HTML page
shell with one stylesheet, and PNG figures (drawn off-screen, written whole, embedded in a page).

Its users are `tirl.eval.report` (a run's report), `tirl.synth.report` (a synth run's stage
statistics), `tirl.studies.races_report` (the RACES study) and `tirl.studies.ablate` (the
ablation table), and `tirl.eval.benchmark_eval`'s figure. It sits in the base layer because
`train`, `eval` and `synth` never import each other: every one of them may import this.

It holds no report's content or structure: each writer keeps its own sections, columns and words
and calls these for the repeated parts. Pages are static and self-contained (figures inlined as
`data:` URIs, no external assets). The interactive trajectory viewer (`tirl.eval.viewer`) keeps
its own page and script and shares only `escape`. matplotlib is imported only when a figure is
made, so a writer without plots (synth, ablate) does not load it.
"""

from __future__ import annotations

import base64
import html
import io
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from tirl.files import write_bytes

if TYPE_CHECKING:
    from matplotlib.figure import Figure

# ---------------------------------------------------------------------------- escaping


def escape(value) -> str:
    """`value` as HTML text that the browser reads back unchanged, in an element or a quoted
    attribute (`<`, `>`, `&`, `"` and `'` escaped). A raw CR would be parsed as a newline, so it
    becomes a character reference; NUL cannot be written in HTML at all (the parser drops it),
    so it is shown as U+FFFD."""
    text = html.escape(str(value), quote=True)
    return text.replace("\r", "&#13;").replace("\x00", "\ufffd")


def md_cell(value) -> str:
    """`value` as one markdown table cell: a `|` would end the cell and a newline the row."""
    return str(value).replace("|", "\\|").replace("\n", " ")


# ---------------------------------------------------------------------------- tables

# One character per column, the same for markdown and HTML: "<" left, ">" right (numbers),
# "-" the renderer's default (left). A column past the end of `align` gets "-".
_MD_RULES = {"-": "---", "<": ":---", ">": "---:"}


def _aligned(align: str, n: int) -> str:
    return align[:n].ljust(n, "-")


def md_table(header: Sequence, rows: Iterable[Sequence], align: str = "") -> str:
    """A markdown table (no trailing newline); every cell goes through `md_cell`."""

    def line(cells: Sequence) -> str:
        return "| " + " | ".join(md_cell(c) for c in cells) + " |"

    rule = "|" + "|".join(_MD_RULES[a] for a in _aligned(align, len(header))) + "|"
    return "\n".join([line(header), rule, *(line(r) for r in rows)])


def html_table(header: Sequence, rows: Iterable[Sequence], align: str = "") -> str:
    """An HTML table of escaped cells; `align` as for `md_table` (">" columns get class=num,
    which the shared stylesheet right-aligns)."""

    def line(cells: Sequence, tag: str) -> str:
        marks = _aligned(align, len(cells))
        tds = (
            f"<{tag}{' class=num' if a == '>' else ''}>{escape(c)}</{tag}>"
            for c, a in zip(cells, marks)
        )
        return "<tr>" + "".join(tds) + "</tr>"

    return "<table>" + line(header, "th") + "".join(line(r, "td") for r in rows) + "</table>"


# ---------------------------------------------------------------------------- pages

STYLE = """
body{font-family:system-ui,-apple-system,"Segoe UI",sans-serif;max-width:1150px;margin:2em auto;
  padding:0 1em;color:#1f2328;line-height:1.45}
h1{margin-bottom:.2em} h2{border-bottom:1px solid #d0d7de;padding-bottom:.2em;margin-top:1.6em}
.headline{font-size:1.1em;font-weight:600}
table{border-collapse:collapse;font-variant-numeric:tabular-nums;margin:.5em 0}
th,td{border:1px solid #d0d7de;padding:3px 9px;text-align:left;vertical-align:top}
th{background:#f6f8fa} td.num,th.num{text-align:right}
figure{margin:1em 0} figcaption{font-weight:600;margin-bottom:.3em} img{max-width:100%}
pre{white-space:pre-wrap;word-break:break-word;background:#f6f8fa;padding:.7em;border-radius:4px;
  font:12.5px/1.45 ui-monospace,SFMono-Regular,Menlo,Consolas,monospace}
"""


def element(tag: str, text, cls: str = "") -> str:
    """`<tag>text</tag>` with `text` escaped: a heading, a paragraph, a list item."""
    attr = f' class="{escape(cls)}"' if cls else ""
    return f"<{tag}{attr}>{escape(text)}</{tag}>"


def html_page(title: str, body: Iterable[str], *, css: str = "", script: str = "") -> str:
    """A whole page: `title` in the browser's tab, the shared `STYLE` (then `css`), the `body`
    parts (already HTML) one per line, and `script` at the end, where the page it acts on
    exists."""
    head = [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{escape(title)}</title>",
        f"<style>{STYLE}{css}</style></head><body>",
    ]
    tail = [f"<script>{script}</script>"] if script else []
    return "\n".join([*head, *body, *tail, "</body></html>"]) + "\n"


# ---------------------------------------------------------------------------- figures


def figure(figsize: tuple[float, float], **kwargs) -> Figure:
    """A matplotlib figure drawn by Agg, without pyplot: pyplot's global backend and figure list
    stay untouched, so reports draw the same on a machine without a display and leak nothing."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize, **kwargs)
    FigureCanvasAgg(fig)
    return fig


def png_bytes(fig: Figure, dpi: int) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=dpi)
    return buf.getvalue()


def save_png(fig: Figure, path: str | Path, dpi: int) -> Path:
    """Write `fig` to `path` as a PNG, whole or not at all (`tirl.files`): a run killed while
    plotting leaves no half-written picture for the next report to embed."""
    write_bytes(path, png_bytes(fig, dpi))
    return Path(path)


def png_data_uri(png: bytes | str | Path | Figure, dpi: int = 100) -> str:
    """A `data:image/png;base64,...` URI of PNG bytes, a PNG file or a figure (drawn at `dpi`),
    so the page needs no file beside it."""
    if isinstance(png, (str, Path)):
        png = Path(png).read_bytes()
    elif not isinstance(png, bytes):
        png = png_bytes(png, dpi)
    return "data:image/png;base64," + base64.b64encode(png).decode("ascii")


def figure_html(png: bytes | str | Path | Figure, caption: str = "", dpi: int = 100) -> str:
    """An embedded PNG (see `png_data_uri`) in a <figure>, `caption` above it and as its alt
    text."""
    head = element("figcaption", caption) if caption else ""
    return f'<figure>{head}<img alt="{escape(caption)}" src="{png_data_uri(png, dpi)}"></figure>'
