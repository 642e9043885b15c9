"""Per-trajectory code-execution statistics and their batch aggregates (CIR Table 4 style).

A tool call with status "skipped" was refused because the interaction budget was spent, and one
with status "disabled" was for a tool the run did not enable (`tirl.tools`); neither is counted
as a call (disabled blocks are counted apart, `num_disabled`). Every other status that is not "ok" (error, timeout, ...) counts as an
error. A *void turn* is an executed call that gave the model nothing new: its output was empty,
or its code repeated the previous call's code exactly (after stripping surrounding whitespace).
Token counts separate model tokens (trained on) from tool tokens (masked out).

Per tool: `by_tool` counts each tool's executed calls, ok calls and errors (ToolCall.tool;
"python" for records from before tools were named), and the batch aggregates add
`tools/<tool>/calls_mean`, `.../errors_mean` and `.../ok_share` beside the totals.
"""

from __future__ import annotations

import math

from tirl.protocol.segments import Trajectory

OK = "ok"
SKIPPED = "skipped"
DISABLED = "disabled"
NOT_RUN = (SKIPPED, DISABLED)


def tool_stats(traj: Trajectory) -> dict:
    """Statistics of one trajectory.

    Keys: `num_calls` (executed calls: status != "skipped"), `num_ok`, `num_error` (executed,
    status != "ok"), `num_skipped`, `num_void` (executed calls with empty output, or whose code
    repeats the previous executed call's), `all_ok` (at least one call and no error),
    `any_error`, `last_ok` (whether the last executed call returned "ok"; None with no calls),
    `model_tokens`, `tool_tokens`, `num_disabled` (blocks for a tool that was not enabled),
    `by_tool` ({tool: {"num_calls", "num_ok", "num_error"}} over executed calls).
    """
    executed = [c for c in traj.tool_calls if c.status not in NOT_RUN]
    num_ok = sum(c.status == OK for c in executed)
    num_error = len(executed) - num_ok
    num_void = sum(
        not c.output_text.strip() or (i > 0 and c.code.strip() == executed[i - 1].code.strip())
        for i, c in enumerate(executed)
    )
    by_tool: dict[str, dict[str, int]] = {}
    for c in executed:
        counts = by_tool.setdefault(c.tool, {"num_calls": 0, "num_ok": 0, "num_error": 0})
        counts["num_calls"] += 1
        counts["num_ok" if c.status == OK else "num_error"] += 1
    return {
        "num_calls": len(executed),
        "num_ok": num_ok,
        "num_error": num_error,
        "num_skipped": sum(c.status == SKIPPED for c in traj.tool_calls),
        "num_disabled": sum(c.status == DISABLED for c in traj.tool_calls),
        "num_void": num_void,
        "all_ok": bool(executed) and num_error == 0,
        "any_error": num_error > 0,
        "last_ok": executed[-1].status == OK if executed else None,
        "model_tokens": traj.num_model_tokens,
        "tool_tokens": traj.num_tool_tokens,
        "by_tool": by_tool,
    }


def _ratio(num: float, den: float) -> float:
    return num / den if den else math.nan


def aggregate_tool_stats(stats: list[dict]) -> dict:
    """Batch metrics from a list of `tool_stats` results.

    - `tools/calls_mean`, `tools/errors_mean`, `tools/void_mean`: mean calls / errors / void
      turns per trajectory.
    - `tools/ok_share`, `tools/error_share`: ok (error) calls / all executed calls in the batch,
      so trajectories with many calls weigh more.
    - `tools/last_ok_rate`: share of trajectories whose last executed call was ok, over
      trajectories with at least one call.
    - `tools/with_call_rate`: share of trajectories with at least one call.
    - `length/model_tokens_mean`, `length/tool_tokens_mean`.
    - `tools/disabled_mean`: mean blocks per trajectory for a tool the run did not enable.
    - per tool seen in the batch: `tools/<tool>/calls_mean`, `tools/<tool>/errors_mean` (per
      trajectory, over all of them) and `tools/<tool>/ok_share` (that tool's ok / its calls).

    Shares whose denominator is 0 (no calls in the batch) are nan, not 0: "no calls" must not
    read as "every call failed". An empty list gives an empty dict. Stats stored before
    `by_tool` and `num_disabled` existed read as Python calls and no disabled blocks.
    """
    n = len(stats)
    if n == 0:
        return {}
    calls = sum(s["num_calls"] for s in stats)
    with_call = [s for s in stats if s["num_calls"] > 0]
    per_tool: dict[str, dict[str, int]] = {}
    for s in stats:
        by_tool = s.get("by_tool")
        if by_tool is None:  # a record from before tools were named: every call was Python
            by_tool = {"python": {k: s[k] for k in ("num_calls", "num_ok", "num_error")}}
        for tool, counts in by_tool.items():
            total = per_tool.setdefault(tool, {"num_calls": 0, "num_ok": 0, "num_error": 0})
            for key in total:
                total[key] += counts[key]
    per_tool_metrics = {}
    for tool, total in sorted(per_tool.items()):
        if total["num_calls"] == 0:
            continue
        per_tool_metrics[f"tools/{tool}/calls_mean"] = total["num_calls"] / n
        per_tool_metrics[f"tools/{tool}/errors_mean"] = total["num_error"] / n
        per_tool_metrics[f"tools/{tool}/ok_share"] = total["num_ok"] / total["num_calls"]
    return {
        "tools/calls_mean": calls / n,
        "tools/errors_mean": sum(s["num_error"] for s in stats) / n,
        "tools/void_mean": sum(s["num_void"] for s in stats) / n,
        "tools/ok_share": _ratio(sum(s["num_ok"] for s in stats), calls),
        "tools/error_share": _ratio(sum(s["num_error"] for s in stats), calls),
        "tools/last_ok_rate": _ratio(sum(bool(s["last_ok"]) for s in with_call), len(with_call)),
        "tools/with_call_rate": len(with_call) / n,
        "length/model_tokens_mean": sum(s["model_tokens"] for s in stats) / n,
        "length/tool_tokens_mean": sum(s["tool_tokens"] for s in stats) / n,
        "tools/disabled_mean": sum(s.get("num_disabled", 0) for s in stats) / n,
        **per_tool_metrics,
    }
