"""Per-step metrics to JSONL, and optionally to TensorBoard and Weights & Biases.

`metrics.jsonl` is append-only (`tirl.files.JsonlAppender`): a torn last line left by a crash or
a full disk is cut before the first new record, and `keep_only` rewrites the file atomically (a
resumed phase first drops the records it is about to log again).
"""

from __future__ import annotations

import json
import resource
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from tirl.files import JsonlAppender, read_jsonl
from tirl.protocol.segments import Trajectory
from tirl.rewards.toolstats import aggregate_tool_stats, tool_stats
from tirl.rollout.limits import is_truncated

if TYPE_CHECKING:
    import torch


def peak_rss_gb() -> float:
    """This process's peak resident memory so far, in GB (logged as `mem/peak_rss_gb` with
    every SFT and RL step, so a run shows which phase holds the most)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6  # Linux: kB


def batch_metrics(trajs: list[Trajectory], rewards: torch.Tensor) -> dict:
    """Statistics of an RL step's trained batch (`rewards` [B], one per trajectory): reward,
    accuracy and truncation, lengths in model and tool tokens, tool use."""
    n = len(trajs)
    return {
        "train/reward_mean": float(rewards.mean()),
        "train/accuracy": sum(t.correct for t in trajs) / n,
        "train/truncation_rate": sum(is_truncated(t) for t in trajs) / n,
        "length/model_tokens_mean": sum(t.num_model_tokens for t in trajs) / n,
        "length/tool_tokens_mean": sum(t.num_tool_tokens for t in trajs) / n,
        **aggregate_tool_stats([tool_stats(t) for t in trajs]),
    }


class MetricsLogger:
    def __init__(
        self, path: Path, tensorboard: bool = False, wandb: bool = False, run_name: str = ""
    ) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = JsonlAppender(path, dumps=lambda r: json.dumps(r, default=float))
        self._tb = self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` extra

            self._tb = SummaryWriter(str(path.parent / "tensorboard"))
        if wandb:
            import wandb as wandb_lib  # needs the `wandb` extra

            self._wandb = wandb_lib.init(project="tirl", name=run_name, dir=str(path.parent))

    def log(self, record: dict) -> None:
        self._file.append(record)
        prefix = f"{record.get('variant', '')}/{record.get('phase', '')}/".strip("/") + "/"
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(prefix + key, value, record.get("step", 0))
        if self._wandb is not None:
            self._wandb.log({prefix + k: v for k, v in numbers.items()})

    def keep_only(self, keep: Callable[[dict], bool]) -> None:
        """Rewrite the JSONL file with the records `keep` accepts (TensorBoard and W&B keep
        what they were sent)."""
        self._file.rewrite([r for r in read_jsonl(self.path) if keep(r)])

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
