"""tirl.eval's evaluation and report as the `Evaluation` the training pipeline, `tirl ablate`
and `tirl study` are handed (tirl.train does not import tirl.eval: docs/architecture.md's
layers)."""

from __future__ import annotations

from pathlib import Path

from tirl.eval.evaluate import check_failed_share, evaluate_policy, first_failure
from tirl.eval.gains import gains_text, rl_gains
from tirl.eval.report import format_summary_table, summary_rows, write_report
from tirl.train.pipeline import Evaluation


def summary(results: dict, run_dir: Path) -> str:
    """The evaluation table, then what RL changed over its SFT start (when both were run)."""
    table = format_summary_table(summary_rows(results))
    gains = rl_gains(run_dir)
    return f"{table}\n\n{gains_text(gains)}" if gains else table


def evaluation() -> Evaluation:
    return Evaluation(
        evaluate_policy=evaluate_policy,
        check_failed_share=check_failed_share,
        first_failure=first_failure,
        write_report=write_report,
        summary_table=summary,
    )
