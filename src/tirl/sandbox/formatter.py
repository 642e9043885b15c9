"""The one function that turns an `ExecResult` into the text the model sees.

What the model reads after a tool call is part of the RL environment: training and evaluation
must show it the same bytes for the same result. Every rule lives here, is deterministic, and is
versioned by `FORMATTER_VERSION`; bump the version whenever the output for some result changes.
"""

from __future__ import annotations

import re

from tirl.sandbox.result import ExecResult, Status

FORMATTER_VERSION = "1"
# What the model is shown of a cell's output, at most, by default: the one default of every
# config and call that sets it (RL, evaluation, SFT demonstrations, synthesis).
SHOWN_OUTPUT_CHARS = 512

# A traceback longer than this many lines keeps its first TB_HEAD_LINES (the header and the
# failing line of the cell) and its last TB_TAIL_LINES (innermost frames and the exception).
TB_HEAD_LINES = 3
TB_TAIL_LINES = 8

# CSI sequences (colours, cursor moves), OSC sequences (titles, links) and two-byte escapes.
_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")


def truncation_marker(n_dropped: int) -> str:
    """The marker put where `n_dropped` characters were cut out of the middle of a text."""
    return f"\n…[{n_dropped} chars truncated]…\n"


def truncate_middle(text: str, max_chars: int) -> str:
    """Keep the head and tail of `text` so that the result, marker included, has at most
    `max_chars` characters. The head gets the extra character when the kept count is odd."""
    if len(text) <= max_chars:
        return text
    dropped = len(text) - max_chars
    for _ in range(4):  # the marker's length depends on the count it reports; reach a fixed point
        keep = max_chars - len(truncation_marker(dropped))
        if keep < 2:
            return text[:max_chars]
        if len(text) - keep == dropped:
            break
        dropped = len(text) - keep
    keep = len(text) - dropped
    head, tail = (keep + 1) // 2, keep // 2
    return text[:head] + truncation_marker(dropped) + text[len(text) - tail :]


def strip_ansi(text: str) -> str:
    return _ANSI.sub("", text)


def shorten_traceback(tb: str) -> str:
    """Keep the first TB_HEAD_LINES and last TB_TAIL_LINES lines of a long traceback."""
    lines = tb.rstrip("\n").split("\n")
    if len(lines) <= TB_HEAD_LINES + TB_TAIL_LINES + 1:
        return "\n".join(lines)
    omitted = len(lines) - TB_HEAD_LINES - TB_TAIL_LINES
    return "\n".join(
        lines[:TB_HEAD_LINES] + [f"  …[{omitted} lines omitted]…"] + lines[-TB_TAIL_LINES:]
    )


def format_result(result: ExecResult, max_chars: int = SHOWN_OUTPUT_CHARS) -> str:
    """Render `result` as the tool output shown to the model.

    Rules (FORMATTER_VERSION "1"), applied in order:

    1. ANSI escape sequences are removed from stdout and the traceback. Trailing newlines of
       stdout are removed; call the result OUT. stderr is never shown.
    2. By status:
       - OK: OUT (the empty string when nothing was printed).
       - ERROR: OUT, a newline, then the traceback. A traceback of more than
         TB_HEAD_LINES + TB_TAIL_LINES + 1 = 12 lines keeps its first 3 lines, a line
         `  …[K lines omitted]…`, and its last 8 lines, so it still ends with
         `ExceptionType: message`. Without a traceback: `Error: {detail or "the cell failed"}`.
       - TIMEOUT: OUT, a newline, then `TimeoutError: execution exceeded {timeout_s:g} s`
         (`TimeoutError: {detail}` when there is no timeout_s, e.g. the CPU limit).
       - MEMORY: OUT, a newline, then `MemoryError: {detail or "out of memory"}`.
       - KILLED: OUT, a newline, then
         `Error: the interpreter process died ({detail or "cause unknown"})`.
       The leading `OUT + newline` is left out when OUT is empty.
    3. If the text is longer than `max_chars`, the middle is replaced by
       `\\n…[N chars truncated]…\\n` so that the whole, marker included, has exactly `max_chars`
       characters: the first ceil(k/2) and last floor(k/2) characters are kept, where
       k = max_chars - len(marker) and N is the number of characters removed.
    """
    status = Status(result.status)
    out = strip_ansi(result.stdout).rstrip("\n")
    if status is Status.OK:
        text = out
    else:
        if status is Status.ERROR:
            if result.traceback:
                last = shorten_traceback(strip_ansi(result.traceback))
            else:
                last = f"Error: {result.detail or 'the cell failed'}"
        elif status is Status.TIMEOUT:
            if result.timeout_s is not None:
                last = f"TimeoutError: execution exceeded {result.timeout_s:g} s"
            else:
                last = f"TimeoutError: {result.detail or 'execution exceeded the time limit'}"
        elif status is Status.MEMORY:
            last = f"MemoryError: {result.detail or 'out of memory'}"
        else:
            last = f"Error: the interpreter process died ({result.detail or 'cause unknown'})"
        text = f"{out}\n{last}" if out else last
    return truncate_middle(text, max_chars)
