"""Per-step metrics to JSONL, and optionally to TensorBoard and Weights & Biases."""

from __future__ import annotations

import json
from pathlib import Path


class MetricsLogger:
    def __init__(
        self, path: Path, tensorboard: bool = False, wandb: bool = False, run_name: str = ""
    ) -> None:
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = path.open("a")
        self._tb = self._wandb = None
        if tensorboard:
            from torch.utils.tensorboard import SummaryWriter  # needs the `tensorboard` extra

            self._tb = SummaryWriter(str(path.parent / "tensorboard"))
        if wandb:
            import wandb as wandb_lib  # needs the `wandb` extra

            self._wandb = wandb_lib.init(project="tirl", name=run_name, dir=str(path.parent))

    def log(self, record: dict) -> None:
        self._file.write(json.dumps(record, default=float) + "\n")
        self._file.flush()
        prefix = f"{record.get('variant', '')}/{record.get('phase', '')}/".strip("/") + "/"
        numbers = {k: v for k, v in record.items() if isinstance(v, (int, float)) and k != "step"}
        if self._tb is not None:
            for key, value in numbers.items():
                self._tb.add_scalar(prefix + key, value, record.get("step", 0))
        if self._wandb is not None:
            self._wandb.log({prefix + k: v for k, v in numbers.items()})

    def close(self) -> None:
        self._file.close()
        if self._tb is not None:
            self._tb.close()
        if self._wandb is not None:
            self._wandb.finish()
