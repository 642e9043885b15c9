"""tirl.files by hand: torn JSONL tails are cut and nothing else, whole-file writes leave the old
file or the new one and no temporary, and a damaged file is reported in one line."""

from __future__ import annotations

import json

import pytest
import torch

from tirl.files import (
    DamagedFile,
    JsonlAppender,
    open_replacing,
    read_jsonl,
    read_whole,
    repair_jsonl,
    replacing,
    write_text,
)

GOOD = b'{"a": 1}\n{"a": 2}\n'


@pytest.mark.parametrize(
    "tail, cut",
    [
        (b"", 0),  # nothing torn
        (b'{"a": 3', 7),  # cut short by a crash or a full disk
        (b'{"a": 3}garbage\n', 16),  # a fragment an older tirl appended a record onto
        (b"\x00" * 9, 9),  # NUL bytes left by a power loss
        (b"\x00\x00\n\n", 4),
        (b'[1, 2]\n"text"\n', 14),  # JSON, but not records
    ],
)
def test_repair_cuts_only_the_torn_tail(tmp_path, tail, cut):
    path = tmp_path / "x.jsonl"
    path.write_bytes(GOOD + tail)
    assert repair_jsonl(path) == cut
    assert path.read_bytes() == GOOD


def test_repair_keeps_a_whole_last_record_that_lost_its_newline_and_bad_lines_before_it(
    tmp_path,
):
    path = tmp_path / "x.jsonl"
    path.write_bytes(b'{"a": 1}\nnot json\n{"a": 2}')
    assert repair_jsonl(path) == 0
    assert path.read_bytes() == b'{"a": 1}\nnot json\n{"a": 2}\n'
    assert list(read_jsonl(path)) == [{"a": 1}, {"a": 2}]


def test_repair_walks_back_across_read_chunks(tmp_path):
    path = tmp_path / "x.jsonl"
    records = [{"i": i, "pad": "y" * 5000} for i in range(40)]  # lines span 64 kB chunks
    whole = "".join(json.dumps(r) + "\n" for r in records).encode()
    path.write_bytes(whole + b'{"i": 40, "pad": "' + b"y" * 70000)
    repair_jsonl(path)
    assert path.read_bytes() == whole


def test_an_appender_starts_a_clean_line_after_a_torn_one(tmp_path):
    path = tmp_path / "x.jsonl"
    path.write_bytes(GOOD + b'{"a": 3')
    with JsonlAppender(path) as log:
        log.append({"a": 3})
        log.rewrite([{"a": 0}])  # atomically, then appending goes on in the new file
        log.append({"a": 4})
    assert list(read_jsonl(path)) == [{"a": 0}, {"a": 4}]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    path = tmp_path / "eval.json"
    write_text(path, "old")
    with pytest.raises(RuntimeError):
        with open_replacing(path) as f:
            f.write(b"half of the new")
            raise RuntimeError("the serializer failed")
    assert path.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["eval.json"]
    folder = tmp_path / "sft"
    with replacing(folder) as tmp:
        tmp.mkdir()
        (tmp / "config.json").write_text("{}")
    with pytest.raises(OSError) as err:
        with replacing(folder) as tmp:
            tmp.mkdir()
            (tmp / "missing" / "model.safetensors").write_bytes(b"")  # an I/O error
    assert err.value.filename == str(folder)  # the path the user knows, not the temporary
    assert [p.name for p in folder.iterdir()] == ["config.json"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["eval.json", "sft"]


def test_a_damaged_checkpoint_is_one_line_naming_it(tmp_path):
    path = tmp_path / "trainer.pt"
    with open_replacing(path) as f:
        torch.save({"step": 3}, f)
    load = lambda f: torch.load(f, weights_only=False)  # noqa: E731
    assert read_whole(path, load, "delete it")["step"] == 3
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(DamagedFile) as err:
        read_whole(path, load, "delete it to start over")
    assert str(path) in str(err.value) and "start over" in str(err.value)
    assert len(str(err.value).splitlines()) == 1
