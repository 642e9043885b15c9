"""The pass-rate curriculum (`rl.curriculum`, `tirl.train.curriculum`) on verl's data path.

verl 0.9.1 has no prompt-sampler hook that sees rewards: `create_rl_sampler` makes a plain
random or sequential sampler, and the v1 trainer's `trainer.v1.sampler.custom_sampler` replaces
the replay buffer over finished rollouts, not the choice of prompts. What it does have is
`data.custom_cls.{path,name}`: the class of the train (and validation) dataset. So the
curriculum lives in a dataset, `CurriculumDataset`:

- draws: the exported train rows (`tirl verl data`, each carrying its task with its meta in
  `extra_info.tirl_task`), repeated, are the curriculum's stream: stream position p is row
  p mod N. The dataset counts the rows it has handed out; its k-th `__getitem__` is trainer
  position k, and returns the row `Curriculum` draws for k, whatever index verl's sampler
  asked for. The row's `extra_info` gets the position and the feedback board's name, so each
  of verl's n samples of the row knows them.
- feedback: tirl's agent loop scores every sample itself; a training sample whose row has a
  position reports (position, correct) to the board, a named Ray actor
  (`tirl-curriculum:<run name>`). Before each draw the dataset takes the board's reports, and
  observes every group whose n samples are all in, in position order (`CurriculumFeed`).
- determinism: verl's synchronous v1 trainer (`trainer.v1.trainer_mode: sync`, what
  `python -m verl.trainer.main_ppo` runs) fetches step s's batch in `prepare_step`, after step
  s - 1 has finished: its rollouts, the loop's rewards and so its reports are all in. With
  `data.dataloader_num_workers: 0` the fetch runs `__getitem__` in the trainer's own process,
  at that moment (worker processes would prefetch batches ahead, each with a copy of the
  dataset). So step s draws on the groups of steps < s, as tirl's own trainer does.
- resume: verl saves `train_dataloader.state_dict()` as `data.pt` in each checkpoint, and
  torchdata's StatefulDataLoader (single process) saves the dataset's `state_dict()` in it and
  calls `load_state_dict` on resume. The state is the curriculum's (`Curriculum.state_dict`),
  the next position and the reports of unfinished groups; `state_dict` first takes the
  board's reports, so groups finished before the checkpoint are not lost with the board.

Not covered, refused by `tirl verl config`: `rl.adaptive_batch` (verl refills dropped groups
with single-prompt fetches in the middle of a step, drawn on whatever groups happen to have
finished) and partial rollouts (the asynchronous v1 modes fetch prompts ahead of the rates
they should depend on: draws lag by the rollout queue's depth, and differ from run to run).
`trainer.v1.trainer_mode=separate_async` appended by hand is not seen by the translation:
the curriculum then runs with that lag.

Metrics: verl's trackers take no metrics from a dataset, so the dataset writes the
`curriculum/...` keys of tirl's trainer itself, one JSONL record per trainer step
(`{"step": s, "curriculum/...": ...}`) to `metrics_file` (`tirl verl config`:
OUT_DIR/NAME/curriculum_metrics.jsonl). Step s's record is written when step s + 1 draws its
first row, when step s's groups are all in; so the last step of a run has none. A resumed run
appends from its checkpoint's step on: where a step has two records, the later one counts.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from torch.utils.data import Dataset

from tirl.config import ConfigError, from_dict
from tirl.files import JsonlAppender
from tirl.integrations.verl.data import task_of_row
from tirl.run.config import CurriculumConfig
from tirl.train.curriculum import Curriculum

SECTION = "data.tirl_curriculum"  # the verl config keys the dataset reads (`tirl verl config`)
BOARD_PREFIX = "tirl-curriculum"
POSITION_KEY = "curriculum_position"  # extra_info keys the dataset adds to a drawn row
BOARD_KEY = "curriculum_board"
METRICS_KEYS = ("batch_size", "metrics_file")  # SECTION's keys for the metrics file


# ---------------------------------------------------------------- the feedback board


class ReportBoard:
    """What the run's training samples reported, (position, correct) pairs, until taken."""

    def __init__(self) -> None:
        self.reports: list[tuple[int, bool]] = []

    def report(self, position: int, correct: bool) -> None:
        self.reports.append((int(position), bool(correct)))

    def take(self) -> list[tuple[int, bool]]:
        taken, self.reports = self.reports, []
        return taken


_BOARDS: dict[tuple[str, str | None], Any] = {}  # (name, Ray job) -> board or actor handle


def board_name(run_name: str) -> str:
    return f"{BOARD_PREFIX}:{run_name}"


def _ray_job() -> str | None:
    import ray

    return ray.get_runtime_context().get_job_id() if ray.is_initialized() else None


def board_handle(name: str):
    """Board `name`: the named Ray actor (made by whoever asks first, found by the others)
    when Ray is initialized -- verl's trainer and its agent-loop workers are processes of one
    Ray job -- else this process's own object. Cached per process and Ray job."""
    key = (name, _ray_job())
    if key not in _BOARDS:
        if key[1] is None:
            _BOARDS[key] = ReportBoard()
        else:
            import ray

            actor = ray.remote(ReportBoard).options(name=name, get_if_exists=True, num_cpus=0)
            _BOARDS[key] = actor.remote()
    return _BOARDS[key]


def take_reports(board) -> list[tuple[int, bool]]:
    if isinstance(board, ReportBoard):
        return board.take()
    import ray

    return ray.get(board.take.remote())


async def report_sample(extra_info: Mapping[str, Any], correct: bool) -> None:
    """Report a finished training sample to its row's board; rows without a curriculum
    position (validation rows, a plain dataset) report nothing."""
    if extra_info.get(POSITION_KEY) is None:
        return
    board = board_handle(str(extra_info[BOARD_KEY]))
    if isinstance(board, ReportBoard):
        board.report(extra_info[POSITION_KEY], correct)
    else:
        await board.report.remote(int(extra_info[POSITION_KEY]), bool(correct))


# ---------------------------------------------------------------- the curriculum over rows


def finished_groups(pending: dict[int, list[bool]], group_size: int) -> list[tuple[int, float]]:
    """(position, pass rate) of every group in `pending` with all `group_size` samples in,
    in position order; they are removed from `pending`."""
    done = sorted(p for p, results in pending.items() if len(results) >= group_size)
    groups = []
    for position in done:
        results = pending.pop(position)[:group_size]
        groups.append((position, sum(results) / group_size))
    return groups


class CurriculumFeed:
    """The curriculum as verl's dataset runs it: trainer positions handed out in order, each
    the curriculum's draw, with the pass rates of finished groups fed back in position order
    before every draw. `take` gives the reports that arrived since the last call."""

    def __init__(
        self,
        curriculum: Curriculum,
        group_size: int,
        take: Callable[[], list],
        batch_size: int | None = None,
        record: Callable[[dict], None] | None = None,
    ) -> None:
        """`record`, with `batch_size` (rows per trainer step): called with each finished
        step's record (`step_metrics`, its "step" added; see the module doc)."""
        self.curriculum = curriculum
        self.group_size = group_size
        self.take = take
        self.batch_size = batch_size
        self.record = record
        self.next_position = 0
        self.pending: dict[int, list[bool]] = {}  # position -> results of an unfinished group

    def collect(self) -> None:
        for position, correct in self.take():
            self.pending.setdefault(int(position), []).append(bool(correct))
        for position, pass_rate in finished_groups(self.pending, self.group_size):
            self.curriculum.observe(position, pass_rate)

    def draw(self) -> tuple[int, int]:
        """(trainer position, stream position) of the next row handed out."""
        self.collect()
        position = self.next_position
        if self.record and self.batch_size and position and position % self.batch_size == 0:
            step = position // self.batch_size - 1  # the step whose groups are now all in
            self.record({"step": step, **self.curriculum.step_metrics()})
        self.next_position += 1
        return position, self.curriculum.stream_position(position)

    def state_dict(self) -> dict:
        self.collect()  # a checkpoint keeps the groups finished so far
        return {
            "curriculum": self.curriculum.state_dict(),
            "next_position": self.next_position,
            "pending": {p: list(r) for p, r in self.pending.items()},
        }

    def load_state_dict(self, state: Mapping) -> None:
        self.curriculum.load_state_dict(state["curriculum"])
        self.next_position = int(state["next_position"])
        self.pending = {int(p): list(r) for p, r in state["pending"].items()}


def _plain(node: Any) -> Any:
    """A verl (OmegaConf) config node as plain data; anything else as it is."""
    if not type(node).__module__.startswith("omegaconf"):
        return node
    from omegaconf import OmegaConf

    return OmegaConf.to_container(node, resolve=True)


def curriculum_settings(data_config: Mapping) -> tuple[CurriculumConfig, int, str]:
    """(curriculum settings, group size, run name) from verl's data config (`SECTION`, which
    `tirl verl config` writes; its optional `batch_size` and `metrics_file` are
    `metrics_settings`'); ConfigError naming the key when missing or bad."""
    section = _plain(data_config.get("tirl_curriculum"))
    if not isinstance(section, Mapping):
        raise ConfigError(
            f"{SECTION} is missing: launch verl with the overrides `tirl verl config` prints"
            " for a config with rl.curriculum.enabled",
            SECTION,
        )
    settings = {k: v for k, v in section.items() if k not in METRICS_KEYS}
    extra = {k: settings.pop(k, None) for k in ("group_size", "run")}
    for key, value in extra.items():
        if value is None:
            raise ConfigError(f"{SECTION}.{key} is missing", f"{SECTION}.{key}")
    cfg = from_dict(CurriculumConfig, {**settings, "enabled": True}, SECTION)
    return cfg, int(extra["group_size"]), str(extra["run"])


def metrics_settings(data_config: Mapping) -> tuple[int | None, str | None]:
    """(rows per trainer step, metrics file) from `SECTION`: (None, None) without a file (a
    section written before the file existed), ConfigError naming the key when bad."""
    section = _plain(data_config.get("tirl_curriculum")) or {}
    batch_size, path = section.get("batch_size"), section.get("metrics_file")
    if path is None:
        return None, None
    if not isinstance(batch_size, int) or isinstance(batch_size, bool) or batch_size < 1:
        raise ConfigError(
            f"{SECTION}.batch_size must be the rows of a step (data.train_batch_size) when"
            f" {SECTION}.metrics_file is set, not {batch_size!r}",
            f"{SECTION}.batch_size",
        )
    return batch_size, str(path)


def _same_files(a: Any, b: Any) -> bool:
    def listed(files):
        files = _plain(files)
        return [str(f) for f in ([files] if isinstance(files, str) else files or [])]

    return listed(a) == listed(b)


def check_data_config(data_config: Mapping) -> None:
    """ConfigError for a data config the curriculum cannot run under (module docstring)."""
    workers = data_config.get("dataloader_num_workers", 0)
    if workers:
        raise ConfigError(
            f"data.dataloader_num_workers is {workers}: the curriculum draws in the trainer's"
            " process as each batch is fetched, so it must be 0",
            "data.dataloader_num_workers",
        )
    if _same_files(data_config.get("train_files"), data_config.get("val_files")):
        raise ConfigError(
            "data.val_files is data.train_files: verl builds both with data.custom_cls, and the"
            " curriculum tells them apart by their files; export a test split",
            "data.val_files",
        )


class CurriculumDataset(Dataset):
    """verl's `data.custom_cls` for a run with `rl.curriculum` (module docstring). Built like
    verl's `RLHFDataset` (whose rows it serves); the train set draws by the curriculum, the
    validation set (other files) is served as verl's own dataset serves it."""

    def __init__(self, data_files, tokenizer, config, processor=None, max_samples: int = -1):
        from verl.utils.dataset.rl_dataset import RLHFDataset

        self.rows = RLHFDataset(data_files, tokenizer, config, processor, max_samples)
        self.feed: CurriculumFeed | None = None
        self.board = ""
        if _same_files(data_files, config.get("train_files")):
            check_data_config(config)
            self.feed, self.board = curriculum_feed(self.rows, config)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict:
        if self.feed is None:
            return self.rows[index]
        position, stream_position = self.feed.draw()
        row = self.rows[stream_position % len(self.rows)]
        row["extra_info"] = {
            **(row.get("extra_info") or {}),
            POSITION_KEY: position,
            BOARD_KEY: self.board,
        }
        return row

    # StatefulDataLoader saves and restores a dataset that has these (verl's data.pt).
    def state_dict(self) -> dict:
        return self.feed.state_dict() if self.feed is not None else {}

    def load_state_dict(self, state: Mapping) -> None:
        if self.feed is not None and state:
            self.feed.load_state_dict(state)


def row_stream(rows) -> Callable[[int], Any]:
    """The curriculum's stream over verl's rows: position p is the task of row p mod N."""
    frame = rows.dataframe
    return lambda p: task_of_row(frame[p % len(frame)]["extra_info"])


def curriculum_feed(rows, data_config: Mapping) -> tuple[CurriculumFeed, str]:
    """The feed over verl's `rows` for the settings in `data_config`, and its board's name.
    The draws are seeded by `data.seed` (the run's seed)."""
    cfg, group_size, run = curriculum_settings(data_config)
    batch_size, metrics_file = metrics_settings(data_config)
    name = board_name(run)
    board = board_handle(name)
    curriculum = Curriculum(row_stream(rows), cfg, int(data_config.get("seed") or 0))
    record = JsonlAppender(metrics_file).append if metrics_file else None
    feed = CurriculumFeed(curriculum, group_size, lambda: take_reports(board), batch_size, record)
    return feed, name
