"""Where a run's builders lived before the run layer: `tirl.run.build` (kept for code that
imports the old path)."""

from tirl.run.build import (  # noqa: F401
    engine_for,
    eval_settings,
    phase_settings,
    rollout_for,
    rollout_settings,
    run_protocol,
    sandbox_for,
)
