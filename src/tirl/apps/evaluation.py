"""tirl.eval's evaluation and report as the `Evaluation` the training pipeline, `tirl ablate`
and `tirl study` are handed (tirl.train does not import tirl.eval: docs/architecture.md's
layers)."""

from __future__ import annotations

from pathlib import Path

from tirl.eval.evaluate import check_failed_share, evaluate_policy, first_failure
from tirl.eval.gains import gains_text, other_gains, rl_gains
from tirl.eval.report import format_summary_table, read_metrics, summary_rows, write_report
from tirl.eval.signal import rl_signal_notes
from tirl.run.evaluation import Evaluation


def summary(results: dict, run_dir: Path) -> str:
    """The evaluation table, what RL changed over its SFT start (when both were run), the
    run's other paired comparisons, and a warning for RL that had nothing to learn from."""
    parts = [format_summary_table(summary_rows(results))]
    gains, others = rl_gains(run_dir), other_gains(run_dir)
    if gains:
        parts.append(gains_text(gains))
    if others:
        parts.append(gains_text(others, "Paired comparisons"))
    notes = rl_signal_notes(read_metrics(Path(run_dir) / "metrics.jsonl"))
    parts += [f"warning: {note}" for note in notes]
    return "\n\n".join(parts)


def evaluation() -> Evaluation:
    return Evaluation(
        evaluate_policy=evaluate_policy,
        check_failed_share=check_failed_share,
        first_failure=first_failure,
        write_report=write_report,
        summary_table=summary,
    )
