"""An RLTrainer as tests and benchmarks build one by hand: a feed over `rollout` and `task_at`,
sampling in CIR's fences with the run's default output limit, as the pipeline does with a
default config (`tirl.train.pipeline.Pipeline.rl` builds the real one from the run config)."""

from __future__ import annotations

from tirl.protocol import CIR_FENCES
from tirl.rollout.limits import budget_at
from tirl.rollout.runner import RolloutSettings
from tirl.run.build import phase_settings
from tirl.run.config import RLConfig
from tirl.train.feed import RolloutFeed
from tirl.train.rl import RLTrainer


def rl_trainer(
    model,
    cfg: RLConfig,
    rollout=None,
    task_at=None,
    *,
    use_tools: bool = True,
    pad_id: int = 0,
    reward_fn=None,
    seed: int = 0,
    dist=None,
    **trainer_options,
) -> RLTrainer:
    """`trainer_options`: the rest of RLTrainer's (logger, variant, capabilities)."""
    feed = RolloutFeed(rollout, task_at, cfg, reward_fn=reward_fn, seed=seed, dist=dist)
    settings = phase_settings(
        CIR_FENCES,
        RolloutSettings.max_output_chars,
        use_tools,
        max_model_tokens=cfg.max_model_tokens,
        tool_budget=budget_at(cfg.budget_schedule, 0.0),
        temperature=cfg.temperature,
        segment_tokens=cfg.segment_tokens or None,
        segment_tool_calls=cfg.segment_tool_calls or None,
    )
    return RLTrainer(model, feed, settings=settings, pad_id=pad_id, **trainer_options)
