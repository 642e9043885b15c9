"""The checks of examples/verl/smoke.sh, over verl's console log and its rollout dumps.

- every step finished (steps 1..3 logged);
- rollout vs actor log-probabilities on model tokens agree (verl's
  `training/rollout_probs_diff_mean`, computed over response_mask): after step 1 this also
  says the new weights reached the servers, since stale servers would drift from the actor;
- the policy moved (`actor/grad_norm` > 0);
- the loop ran code and scored it (the dumped `tool_calls` and `acc` of tirl's loop);
- memory stays flat (`perf/max_memory_allocated_gb` of the last step within 10% of step 1).
"""

from __future__ import annotations

import json
import re
import sys
from pathlib import Path

STEP = re.compile(r"step:(\d+) - (.*)")
PAIR = re.compile(r"([\w/@.\-]+):([-+0-9.eE]+|nan|inf)")
MAX_PROB_GAP = 0.02


def step_metrics(log: Path) -> dict[int, dict[str, float]]:
    steps: dict[int, dict[str, float]] = {}
    for line in log.read_text(errors="replace").splitlines():
        m = STEP.search(line)
        if m:
            steps[int(m.group(1))] = {k: float(v) for k, v in PAIR.findall(m.group(2))}
    return steps


def dumped_rows(folder: Path) -> list[dict]:
    return [json.loads(line) for f in sorted(folder.glob("*.jsonl")) for line in f.open()]


def main(log: str, rollouts: str) -> int:
    steps = step_metrics(Path(log))
    problems = [f"step {s} was not logged" for s in (1, 2, 3) if s not in steps]
    for s, m in sorted(steps.items()):
        gap = m.get("training/rollout_probs_diff_mean", float("nan"))
        if not gap <= MAX_PROB_GAP:
            problems.append(f"step {s}: rollout vs actor probability gap {gap} > {MAX_PROB_GAP}")
        if not m.get("actor/grad_norm", 0.0) > 0:
            problems.append(f"step {s}: actor/grad_norm is not positive")
    if 1 in steps and 3 in steps:
        first = steps[1].get("perf/max_memory_allocated_gb", 0.0)
        last = steps[3].get("perf/max_memory_allocated_gb", 0.0)
        if last > 1.1 * first:
            problems.append(f"memory grew from {first:.1f} GB to {last:.1f} GB")
    rows = dumped_rows(Path(rollouts))
    if not any(r.get("tool_calls", 0) > 0 for r in rows):
        problems.append("no dumped trajectory ran code")
    if not rows or any("acc" not in r for r in rows):
        problems.append("dumped trajectories lack tirl's acc (was the tirl loop used?)")
    for p in problems:
        print("FAIL", p)
    print("smoke:", "ok" if not problems else f"{len(problems)} problem(s)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:3]))
