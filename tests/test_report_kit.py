"""tirl.report_kit, the mechanics every report writer shares: what reaches a page is escaped,
markdown tables survive cells that look like table syntax, and an embedded figure is the PNG."""

from __future__ import annotations

import base64

from tirl.report_kit import (
    escape,
    figure,
    figure_html,
    html_page,
    html_table,
    md_table,
    png_data_uri,
    save_png,
)

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
NASTY = '<b>&"it\'s"</b>'
NASTY_ESCAPED = "&lt;b&gt;&amp;&quot;it&#x27;s&quot;&lt;/b&gt;"


def test_escape_covers_markup_quotes_cr_and_nul():
    assert escape(NASTY) == NASTY_ESCAPED
    assert escape(0.5) == "0.5"  # numbers are cells too
    # a raw CR would come back as a newline, and NUL is dropped by the parser
    assert escape("a\rb\x00") == "a&#13;b\ufffd"


def test_html_table_escapes_every_header_and_cell_and_marks_number_columns():
    table = html_table([NASTY, "n"], [[NASTY, 3]], align="->")
    assert "<b>" not in table and table.count(NASTY_ESCAPED) == 2
    assert table == (
        f"<table><tr><th>{NASTY_ESCAPED}</th><th class=num>n</th></tr>"
        f"<tr><td>{NASTY_ESCAPED}</td><td class=num>3</td></tr></table>"
    )


def test_a_page_escapes_its_title_and_holds_the_shared_stylesheet_once():
    page = html_page(NASTY, ["<p>body</p>"], css=".extra{}", script="go()")
    assert f"<title>{NASTY_ESCAPED}</title>" in page and "<b>" not in page
    assert page.count("<style>") == 1 and ".extra{}</style>" in page and "td.num" in page
    assert page.index("<p>body</p>") < page.index("<script>go()</script>")
    assert page.endswith("</body></html>\n")


def test_markdown_table_escapes_pipes_and_flattens_newlines_as_the_writers_do():
    """A `|` in a cell (or a header) stays inside it, a newline would end the row: both as
    tirl.eval.report always wrote them; the races study's and the ablation's tables, which
    left header pipes and newlines as they were, now get the same treatment."""
    table = md_table(["a|b", "n"], [["x|y", 1], ["two\nlines", 2.5]], align="<>")
    assert table.splitlines() == [
        "| a\\|b | n |",
        "|:---|---:|",
        "| x\\|y | 1 |",
        "| two lines | 2.5 |",
    ]


def test_markdown_alignment_is_one_character_per_column_and_defaults_to_plain_rules():
    assert md_table(["a", "b", "c"], []).splitlines()[1] == "|---|---|---|"
    assert md_table(["a", "b", "c"], [], align="->").splitlines()[1] == "|---|---:|---|"
    # The synth report's table, byte for byte as it wrote it by hand.
    assert md_table(["stage", "in"], [["read", 3], ["", 0]], align="->") == (
        "| stage | in |\n|---|---:|\n| read | 3 |\n|  | 0 |"
    )


def test_an_embedded_figure_decodes_to_the_png_on_disk(tmp_path):
    fig = figure((2, 1.5))
    fig.subplots().plot([0, 1], [1, 0])
    path = save_png(fig, tmp_path / "plots" / "line.png", dpi=50)  # the folder is made
    png = path.read_bytes()
    assert png.startswith(PNG_MAGIC)

    uri = png_data_uri(path)
    assert uri.startswith("data:image/png;base64,")
    assert base64.b64decode(uri.removeprefix("data:image/png;base64,")) == png
    assert png_data_uri(png) == uri  # bytes and the file are the same picture
    # a figure drawn straight into the page is a PNG too, at the dpi asked for
    drawn = base64.b64decode(png_data_uri(fig, dpi=50).split(",", 1)[1])
    assert drawn.startswith(PNG_MAGIC)

    html = figure_html(path, caption="a <b> line")
    assert "<figcaption>a &lt;b&gt; line</figcaption>" in html
    assert f'alt="a &lt;b&gt; line" src="{uri}"' in html
