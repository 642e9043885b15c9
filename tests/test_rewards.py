"""Answer extraction, integer normalization, reward functions and tool statistics."""

import math

import pytest

from tirl.protocol.score import Score
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory
from tirl.rewards.answer import (
    answer_from_trajectory,
    extract_boxed,
    normalize_integer_answer,
    prose_text,
)
from tirl.rewards.reward import configured_reward, make_reward
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats

M, T, P = SegmentKind.MODEL, SegmentKind.TOOL, SegmentKind.PROMPT

# ---------------------------------------------------------------- extract_boxed


@pytest.mark.parametrize(
    "text, expected",
    [
        (r"so \boxed{\frac{1}{2}}.", r"\frac{1}{2}"),  # nested braces
        (r"\boxed{{a}{b{c}}}", "{a}{b{c}}"),
        (r"first \boxed{1}, then \boxed{2}", "2"),  # last box wins
        (r"\boxed {42}", "42"),
        (r"\fbox{7}", "7"),
        (r"\boxed{ 12 }", "12"),
        (r"\boxed{\{1, 2\}}", r"\{1, 2\}"),  # escaped braces are content
        ("no box here", None),
        (r"\boxed{1} and then \boxed{2", None),  # the last box is unbalanced
        (r"\boxed{", None),
        (r"\boxedfoo{3}", None),
    ],
)
def test_extract_boxed(text, expected):
    assert extract_boxed(text) == expected


# ---------------------------------------------------------------- normalize_integer_answer


@pytest.mark.parametrize(
    "s, expected",
    [
        ("42", 42),
        (" 42 ", 42),
        ("1 000", 1000),  # a space as the thousands separator
        ("1 234 567", 1234567),
        ("- 5", -5),
        ("$42$", 42),
        (r"\$42", 42),
        ("1,000", 1000),
        ("1,234,567", 1234567),
        ("1{,}000", 1000),
        (r"1\,000", 1000),
        ("42.", 42),
        ("007", 7),
        ("+5", 5),
        ("-5", -5),
        ("\u22125", -5),
        ("2.5", None),
        ("5.0", None),
        ("12,34", None),  # not thousands grouping: may be a list of answers
        ("1 46", None),  # digit groups split by a space: not 146
        (" 4 2 ", None),
        ("1 0000", None),
        (r"1\,46", None),  # LaTeX's thin space, the same
        ("1/2", None),
        ("x=3", None),
        ("", None),
        (None, None),
    ],
)
def test_normalize_integer_answer(s, expected):
    assert normalize_integer_answer(s) == expected


# ---------------------------------------------------------------- answer_from_trajectory


def _traj(*segs, calls=()):
    return Trajectory(
        segments=[Segment(k, ids, text) for k, ids, text in segs], tool_calls=list(calls)
    )


def test_boxed_in_tool_output_never_scores():
    traj = _traj(
        (P, [1, 2], "Compute 6*7."),
        (M, [3, 4], "```python\nprint(chr(92) + 'boxed{%d}' % (6*7))\n```\n"),
        (T, [5, 6], "```output\n\\boxed{42}\n```\n"),
        (M, [7], "The tool printed it, I am done."),
    )
    assert r"\boxed{42}" in traj.response_text
    assert answer_from_trajectory(traj) is None


def test_answer_comes_from_model_even_when_tool_boxes_later():
    traj = _traj(
        (P, [1], "Q"),
        (M, [2], r"Answer: \boxed{41}. Let me check."),
        (T, [3], r"\boxed{42}"),
    )
    assert answer_from_trajectory(traj) == "41"


# ---------------------------------------------------------------- rewards


def test_binary_and_zero_one_rewards():
    binary, zero_one = make_reward("binary"), make_reward("zero_one")
    assert (binary(True), binary(False), binary.range) == (1.0, -1.0, (-1.0, 1.0))
    assert (zero_one(True), zero_one(False), zero_one.range) == (1.0, 0.0, (0.0, 1.0))
    with pytest.raises(ValueError, match="unknown reward 'nope'; valid: binary, composite"):
        make_reward("nope")
    with pytest.raises(ValueError, match="takes no parameters"):
        make_reward("binary", alpha=1.0)


def test_composite_reward_matches_agentmath_formula_by_hand():
    # R = R_acc + 1[R_acc = 1] * min(R_max, alpha + beta * N_code), alpha 0.1, beta 0.05, R_max 0.25
    r = make_reward("composite", alpha=0.1, beta=0.05, r_max=0.25)
    assert r(False, {"num_calls": 9}) == 0.0  # wrong: no bonus, however much code
    assert r(True, {"num_calls": 0}) == pytest.approx(1.1)  # 1 + min(0.25, 0.1)
    assert r(True, {"num_calls": 2}) == pytest.approx(1.2)  # 1 + min(0.25, 0.1 + 0.1)
    assert r(True, {"num_calls": 10}) == pytest.approx(1.25)  # capped: 0.1 + 0.5 > 0.25
    assert r.range == (0.0, 1.25)
    with pytest.raises(ValueError, match="beta must be >= 0"):
        make_reward("composite", beta=-0.1)


def _traj_ok_then_error():
    return _traj(
        (P, [1, 2, 3], "Q"),
        (M, [4, 5, 6, 7], "code 1"),
        (T, [8, 9], "out 1"),
        (M, [10, 11], "code 2"),
        (T, [12, 13, 14], "Traceback"),
        (M, [15], "done"),
        calls=[
            ToolCall("print(1)", "ok", "1\n"),
            ToolCall("1/0", "error", "ZeroDivisionError"),
            ToolCall("print(3)", "skipped", ""),
        ],
    )


def test_tool_stats_one_ok_one_error():
    s = tool_stats(_traj_ok_then_error())
    assert s == {
        "num_calls": 2,  # the skipped call is not a call
        "num_ok": 1,
        "num_error": 1,
        "num_skipped": 1,
        "num_void": 0,
        "all_ok": False,
        "any_error": True,
        "last_ok": False,  # the last *executed* call errored
        "model_tokens": 7,
        "tool_tokens": 5,
        "num_disabled": 0,
        "by_tool": {"python": {"num_calls": 2, "num_ok": 1, "num_error": 1}},
    }


def test_void_turns_are_empty_outputs_and_repeats_of_the_previous_block():
    calls = [
        ToolCall("x = 1", "ok", ""),  # void: no output
        ToolCall("print(x)", "ok", "1\n"),
        ToolCall(" print(x) \n", "ok", "1\n"),  # void: repeats the previous block
        ToolCall("print(x)", "skipped", ""),  # refused, not executed: not a turn
        ToolCall("print(x + 1)", "ok", "2\n"),
    ]
    s = tool_stats(_traj((P, [1], "Q"), (M, [2], "code"), calls=calls))
    assert (s["num_calls"], s["num_void"]) == (4, 2)
    assert aggregate_tool_stats([s])["tools/void_mean"] == 2.0


def test_the_configured_reward_reads_correctness_tool_calls_and_the_task_reward():
    """`configured_reward(name, params)` (shared by the trainer and the verl plugin) scores a
    trajectory from its typed score and its executed blocks: the composite bonus counts run blocks
    only (a refused one is no call), and `task` pays the task scorer's own reward."""
    calls = [ToolCall("1", "ok", "1\n"), ToolCall("2", "ok", "2\n"), ToolCall("3", "skipped", "")]
    traj = _traj((P, [1], "Q"), (M, [2], "code"), calls=calls)
    composite = configured_reward("composite", {"alpha": 0.1, "beta": 0.05, "r_max": 0.25})
    traj.score = Score(correct=True, reward=1.0)
    assert composite(traj) == pytest.approx(1.0 + 0.1 + 0.05 * 2)
    traj.score = Score(correct=False, reward=0.0)
    assert composite(traj) == 0.0
    traj.score = Score(correct=False, reward=0.5)
    assert configured_reward("task", {})(traj) == 0.5
    assert configured_reward("binary", {})(traj) == -1.0


def test_tool_stats_without_calls():
    s = tool_stats(_traj((P, [1], "Q"), (M, [2, 3], "no code")))
    assert (s["num_calls"], s["all_ok"], s["any_error"], s["last_ok"]) == (0, False, False, None)


def test_aggregate_tool_stats():
    with_calls = tool_stats(_traj_ok_then_error())
    no_calls = tool_stats(_traj((P, [1], "Q"), (M, [2, 3], "no code")))
    agg = aggregate_tool_stats([with_calls, no_calls])
    assert agg["tools/calls_mean"] == 1.0
    assert agg["tools/ok_share"] == 0.5
    assert agg["tools/error_share"] == 0.5
    assert agg["tools/last_ok_rate"] == 0.0  # over the one trajectory that made calls
    assert agg["tools/with_call_rate"] == 0.5
    assert agg["length/model_tokens_mean"] == 4.5  # (7 + 2) / 2
    assert agg["length/tool_tokens_mean"] == 2.5  # (5 + 0) / 2
    none = aggregate_tool_stats([no_calls])
    assert math.isnan(none["tools/ok_share"]) and math.isnan(none["tools/last_ok_rate"])
    assert aggregate_tool_stats([]) == {}


def test_a_box_inside_the_models_own_code_is_not_an_answer():
    code = '```python\nprint("\\\\boxed{42}")\n```'
    traj = Trajectory(
        segments=[
            Segment(SegmentKind.MODEL, [1], code),
            Segment(SegmentKind.TOOL, [2], "\\boxed{42}"),
        ]
    )
    assert answer_from_trajectory(traj) is None


def test_prose_tags_and_the_interpreters_answer_marker_are_read_as_prose():
    """Reasoning, an <answer> tag and a stop-token mode's ```output marker are not code."""
    text = "<think>\nadd\n</think>\n<answer>\n42\n</answer>"
    traj = Trajectory(segments=[Segment(SegmentKind.MODEL, [2], text + "\n```output")])
    assert prose_text(traj) == text + "\n```output"


def test_a_code_block_cut_off_by_the_token_limit_is_not_read():
    traj = Trajectory(segments=[Segment(SegmentKind.MODEL, [2], 'ok <code>\nprint("\\boxed{4')])
    assert prose_text(traj) == "ok "


# ---------------------------------------------------------------- prose_text


@pytest.mark.parametrize(
    "model_text",
    [
        '```python\nprint("\\\\boxed{42}")\n```',  # CIR fences, closed
        '<code>\nprint("\\\\boxed{42}")\n</code>',  # AgentMath tags, closed
        "```bash\necho '\\\\boxed{42}'\n```",  # the shell tool, in fences
        "<bash>\necho '\\\\boxed{42}'\n</bash>",  # the shell tool, in tags
        "```sql\nselect '\\\\boxed{42}'\n```",  # a plugin tool's block
    ],
)
def test_a_box_or_answer_tag_inside_the_models_own_code_is_not_read(model_text):
    traj = Trajectory(
        segments=[
            Segment(SegmentKind.PROMPT, [1], "\\boxed{42} <answer>42</answer>"),
            Segment(SegmentKind.MODEL, [2], model_text + "<answer>7</answer>"),
            Segment(SegmentKind.TOOL, [3], "\\boxed{42}"),
        ]
    )
    prose = prose_text(traj)
    assert "42" not in prose and prose.endswith("<answer>7</answer>")
    assert answer_from_trajectory(traj) is None
