import pytest

from tirl.protocol.fences import closed_code_block, render_code, render_tool_output
from tirl.protocol.segments import Segment, SegmentKind, ToolCall, Trajectory


def test_exact_match_fires_only_on_a_complete_block():
    assert closed_code_block("```python\nprint(1)") is None
    assert closed_code_block("```python\nprint(1)\n``") is None
    assert closed_code_block("```python\nprint(1)\n```") == "print(1)"
    assert (
        closed_code_block("Let me compute.\n```python\nx = 2\nprint(x)\n```") == "x = 2\nprint(x)"
    )
    assert closed_code_block("```output\n3\n```") is None


def test_render_round_trip():
    assert closed_code_block(render_code("print(7 * 6)")) == "print(7 * 6)"
    assert render_tool_output("42") == "\n```output\n42\n```\n"


def test_loss_mask_follows_segment_kinds():
    traj = Trajectory(
        segments=[
            Segment(SegmentKind.PROMPT, [1, 2], "p"),
            Segment(SegmentKind.MODEL, [3, 4, 5], "m", [-0.1, -0.2, -0.3]),
            Segment(SegmentKind.TOOL, [6], "t"),
            Segment(SegmentKind.MODEL, [7], "n", [-0.4]),
        ]
    )
    assert traj.ids == [1, 2, 3, 4, 5, 6, 7]
    assert traj.loss_mask == [0, 0, 1, 1, 1, 0, 1]
    assert traj.num_model_tokens == 4 and traj.num_tool_tokens == 1 and traj.prompt_len == 2
    assert traj.model_text == "mn"


def test_trajectory_round_trips_through_json_dict():
    traj = Trajectory(
        segments=[
            Segment(SegmentKind.PROMPT, [1], "p"),
            Segment(SegmentKind.MODEL, [2], "m", [-1.0]),
        ],
        tool_calls=[ToolCall("print(1)", "ok", "1", 0.01)],
        finish_reason="length",
        meta={"question": "q"},
    )
    assert Trajectory.from_dict(traj.to_dict()) == traj


def test_logprobs_must_align_with_ids():
    with pytest.raises(ValueError, match="2 ids but 1 logprobs"):
        Segment(SegmentKind.MODEL, [1, 2], "x", [-0.5])
