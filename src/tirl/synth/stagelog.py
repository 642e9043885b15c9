"""The outcome file of one synthesis stage, `OUT/stages/NN_<stage>.jsonl`: one JSON line per
item, `{"id", "kept", "reason", "notes", "item"}`, appended as soon as the item is done.

The pipeline writes these files and the report reads them; both import them from here, so
neither module imports the other.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

from tirl.files import JsonlAppender, read_jsonl
from tirl.synth.records import Item

if TYPE_CHECKING:
    from tirl.synth.stages import Outcome


class StageLog:
    """The append-only outcome file of one stage (a line that does not parse, torn by a crash,
    is skipped: its item is redone)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.rows: dict[str, dict] = {}
        for row in read_jsonl(path):
            if "id" in row:
                self.rows.setdefault(row["id"], row)  # first wins: a line is never counted twice
        path.parent.mkdir(parents=True, exist_ok=True)
        self._file = JsonlAppender(path, dumps=lambda r: json.dumps(r, ensure_ascii=False))

    def __contains__(self, item_id: str) -> bool:
        return item_id in self.rows

    def __len__(self) -> int:
        return len(self.rows)

    def append(self, item_id: str, outcome: Outcome) -> None:
        row = {
            "id": item_id,
            "kept": outcome.item is not None,
            "reason": outcome.reason,
            "notes": outcome.notes,
            "item": outcome.item.to_dict() if outcome.item is not None else None,
        }
        self._file.append(row)  # before it counts as done: a full disk raises, nothing is kept
        self.rows[item_id] = row

    def close(self) -> None:
        self._file.close()

    def kept(self, order: dict[str, int]) -> list[Item]:
        """Kept items, in input order (not completion order): reruns give the same files."""
        rows = [r for r in self.rows.values() if r["kept"]]
        rows.sort(key=lambda r: order.get(r["id"], len(order)))
        return [Item.from_dict(r["item"]) for r in rows]


def stage_path(out: Path, i: int, name: str) -> Path:
    """Numbered by the stage's place in the full chain, so turning a stage off between runs
    never makes another stage read the wrong file."""
    return out / "stages" / f"{i:02d}_{name}.jsonl"
