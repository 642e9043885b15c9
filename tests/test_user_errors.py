"""Every config field and every numeric or path flag, given a bad value, stops the command with
one line on stderr and exit code 2, before anything is written or deleted.

The property tests derive their bad values from the schemas and the parser themselves (types,
documented ranges, NaN, infinities, 64-bit overflow, empty and path-like strings, NUL), so a
field or flag added later is covered without touching this file; two meta-tests make sure
every number in a schema or on the command line declares its range.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import typing
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tirl.cli import build_parser, main
from tirl.config import Range
from tirl.run.config import RunConfig
from tirl.studies.races_study import StudySettings
from tirl.synth.config import SynthConfig

# ------------------------------------------------------------------------------- the schemas


def leaves(cls: type, prefix: str = "") -> list[tuple[str, typing.Any, dataclasses.Field]]:
    """(dotted key, annotation, field) of every leaf field of a config schema."""
    out = []
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp, key = hints[f.name], f"{prefix}{f.name}"
        if dataclasses.is_dataclass(tp):
            out += leaves(tp, key + ".")
        else:
            out.append((key, tp, f))
    return out


def _strip_optional(tp):
    args = typing.get_args(tp)
    if typing.get_origin(tp) in (typing.Union, __import__("types").UnionType):
        rest = [a for a in args if a is not type(None)]
        return rest[0], True
    return tp, False


def _outside(rng: Range, integer: bool) -> list:
    """Numbers just outside a range (and its open ends)."""
    step = 1 if integer else 0.5
    bad = []
    if rng.low is not None:
        bad.append(rng.low if rng.low_open else rng.low - step)
    if rng.high is not None:
        bad.append(rng.high if rng.high_open else rng.high + step)
    return [int(b) if integer and float(b).is_integer() else b for b in bad]


NAN, INF, NEG_INF = ".nan", ".inf", "-.inf"  # YAML spellings


def bad_values(tp, f: dataclasses.Field) -> list[str]:
    """YAML texts that the field must refuse."""
    tp, optional = _strip_optional(tp)
    origin = typing.get_origin(tp) or tp
    rng = f.metadata.get("range")
    values: list = [{"a": 1}]
    if not optional:
        values.append(None)
    if origin is int:
        values += ["abc", 1.5, True, [1], 2**64, -(2**64), NAN, INF]
        values += _outside(rng, True) if rng else []
    elif origin is float:
        values += ["abc", True, [1.0], NAN, INF, NEG_INF, "1e999"]
        values += _outside(rng, False) if rng else []
    elif origin is bool:
        values += [3, "maybe", [True]]
    elif origin is str:
        values += [5, [], "bad\0name"]
        check = f.metadata.get("check")
        values += [v for v in ("", " ", "../x", "/abs/x", "a/b", "é" * 200) if check and check(v)]
    elif origin is typing.Literal:
        values += ["no-such-choice", 7]
    elif origin is list:
        (item,) = typing.get_args(tp)
        values += ["not-a-list", [{"a": 1}]]
        item_origin = typing.get_origin(item) or item
        if item_origin is typing.Literal:
            values += [["no-such-choice"]]
        if dataclasses.is_dataclass(item):
            good = {g.name: 1 for g in dataclasses.fields(item)}
            for g in dataclasses.fields(item):
                rng_g = g.metadata.get("range")
                for b in _outside(rng_g, True) if rng_g else []:
                    values.append([{**good, g.name: b}])
        if item_origin is list:  # budget_schedule
            values += [[], [[0.5, 2]], [[0, -1]], [[0, 1.5]], [[0, 2, 3]], [[0, NAN]]]
    return [v if isinstance(v, str) and v in (NAN, INF, NEG_INF) else _yaml(v) for v in values]


def _yaml(value) -> str:
    """A YAML text for `value` (JSON is YAML; NaN spelled the YAML way inside lists)."""
    return json.dumps(value, ensure_ascii=False).replace('".nan"', ".nan")


# The fields whose bad values are known to be refused only by a cross-field rule, or not at all
# by type: every other field must refuse every value `bad_values` makes.
RUN_FIELDS = leaves(RunConfig)
SYNTH_FIELDS = leaves(SynthConfig)
STUDY_FIELDS = leaves(StudySettings, "study.")


def test_every_number_in_every_config_declares_its_range():
    missing = []
    for key, tp, f in RUN_FIELDS + SYNTH_FIELDS + STUDY_FIELDS:
        base, _ = _strip_optional(tp)
        if base in (int, float) and f.metadata.get("range") is None:
            missing.append(key)
        if not f.metadata.get("doc"):
            missing.append(f"{key} (no doc)")
    assert missing == []


def _run(argv: list[str], capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as e:  # argparse's own errors
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


@pytest.fixture()
def workdir(tmp_path, monkeypatch):
    """An empty current directory with one file of the user's in it."""
    (tmp_path / "mine.txt").write_text("keep me")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def _assert_refused(code, out, err, key_words: str, root: Path, before: list[str]):
    assert code == 2, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0], err
    assert "Traceback" not in err and out == ""
    assert key_words in lines[0], lines[0]
    assert _tree(root) == before  # nothing written, nothing deleted


RUN_CASES = [(key, v) for key, tp, f in RUN_FIELDS for v in bad_values(tp, f)]


@pytest.mark.parametrize(("key", "value"), RUN_CASES, ids=[f"{k}={v}" for k, v in RUN_CASES])
def test_every_bad_run_config_value_stops_train_in_one_line(key, value, workdir, capsys):
    before = _tree(workdir)
    code, out, err = _run(["train", f"{key}={value}"], capsys)
    _assert_refused(code, out, err, key.split(".")[0], workdir, before)


SYNTH_CASES = [(key, v) for key, tp, f in SYNTH_FIELDS for v in bad_values(tp, f)]


@pytest.mark.parametrize(("key", "value"), SYNTH_CASES, ids=[f"{k}={v}" for k, v in SYNTH_CASES])
def test_every_bad_synth_config_value_stops_synth_in_one_line(key, value, workdir, capsys):
    before = _tree(workdir)
    argv = ["synth", "run", "teacher.url=http://127.0.0.1:9", f"{key}={value}"]
    code, out, err = _run([*argv, "--input", "in.jsonl", "--out", "out"], capsys)
    _assert_refused(code, out, err, key.split(".")[0], workdir, before)


STUDY_CASES = [(key, v) for key, tp, f in STUDY_FIELDS for v in bad_values(tp, f)]


@pytest.mark.parametrize(("key", "value"), STUDY_CASES, ids=[f"{k}={v}" for k, v in STUDY_CASES])
def test_every_bad_study_config_value_stops_the_study_in_one_line(key, value, workdir, capsys):
    before = _tree(workdir)
    code, out, err = _run(["study", "races", f"{key}={value}"], capsys)
    _assert_refused(code, out, err, "study", workdir, before)


@settings(
    max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    case=st.sampled_from([(k, tp, f) for k, tp, f in RUN_FIELDS]).flatmap(
        lambda c: st.tuples(st.just(c[0]), st.sampled_from(bad_values(c[1], c[2])))
    ),
    in_file=st.booleans(),
)
def test_random_bad_values_in_a_config_file_or_override_are_refused(case, in_file, workdir, capsys):
    key, value = case
    before = _tree(workdir)
    if in_file:  # the same value written into a YAML file
        path = workdir / "bad.yaml"
        *parents, last = key.split(".")
        text = "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
        path.write_text(text + f"{'  ' * len(parents)}{last}: {value}\n", encoding="utf-8")
        before = _tree(workdir)
        argv = ["train", str(path)]
    else:
        argv = ["train", f"{key}={value}"]
    code, out, err = _run(argv, capsys)
    _assert_refused(code, out, err, key.split(".")[0], workdir, before)


# ------------------------------------------------------------------------------- the flags


def _subcommands(parser, prefix=()):
    """(argv prefix, parser) of every leaf subcommand."""
    subs = [a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction"]
    if not subs:
        yield prefix, parser
        return
    for name, child in subs[0].choices.items():
        yield from _subcommands(child, (*prefix, name))


# What each subcommand needs besides the flag under test ({d} is a writable folder).
REQUIRED = {
    ("quickstart",): [],
    ("train",): [],
    ("ablate",): ["--preset", "cir"],
    ("study", "races"): [],
    ("study", "synth"): [],
    ("eval",): ["{d}/no-model"],
    ("config",): [],
    ("sandbox", "serve"): [],
    ("serve",): ["{d}/no-model"],
    ("openenv-serve",): ["--source", "arithmetic"],
    ("view",): ["{d}"],
    ("envs", "list"): [],
    ("envs", "show"): ["lists.sort_ascending"],
    ("envs", "sample"): ["lists.sort_ascending"],
    ("envs", "build"): ["--out", "{d}/t.jsonl"],
    ("envs", "check"): [],
    ("synth", "run"): ["--input", "{d}/in.jsonl", "--out", "{d}/out"],
    ("synth", "races"): ["--out", "{d}/out"],
    ("synth", "report"): ["{d}"],
    ("verl", "data"): ["{d}/mine.txt", "--out", "{d}/t.parquet"],
    ("verl", "sft-data"): ["{d}/mine.txt", "--out", "{d}/t.parquet"],
    ("verl", "config"): ["{d}/mine.txt"],
}


def _flags():
    for prefix, parser in _subcommands(build_parser()):
        for action in parser._actions:
            if action.option_strings and action.type is not None:
                yield prefix, action


def test_every_numeric_flag_declares_its_range_and_every_subcommand_is_covered():
    assert {prefix for prefix, _ in _subcommands(build_parser())} == set(REQUIRED)
    bare = [
        f"{' '.join(p)} {a.option_strings[-1]}"
        for p, a in _flags()
        if a.type in (int, float) and not a.choices
    ]
    assert bare == []


def _bad_flag_values(action) -> list[str]:
    rng = getattr(action.type, "range", None)
    if rng is None:
        return []
    integer = action.type.__name__.startswith("int")
    values = ["abc", "", "nan", "inf", "-inf", "1e999"]
    values += [str(v) for v in _outside(rng, integer)]
    if integer:
        values.append("1.5")
    return values


FLAG_CASES = [
    (prefix, action.option_strings[-1], value)
    for prefix, action in _flags()
    for value in _bad_flag_values(action)
]


@pytest.mark.parametrize(
    ("prefix", "flag", "value"),
    FLAG_CASES,
    ids=[f"{' '.join(p)} {f}={v}" for p, f, v in FLAG_CASES],
)
def test_every_bad_number_flag_is_refused_in_one_line(prefix, flag, value, workdir, capsys):
    required = [a.format(d=workdir) for a in REQUIRED[prefix]]
    before = _tree(workdir)
    code, out, err = _run([*prefix, *required, f"{flag}={value}"], capsys)
    _assert_refused(code, out, err, flag, workdir, before)


# The output flags of the seven commands that write somewhere the user names.
OUTPUT_FLAGS = [
    (["eval", "{d}/no-model", "--out"], "dir"),
    (["ablate", "--preset", "cir", "--out"], "dir"),
    (["synth", "run", "--input", "{d}/in.jsonl", "--out"], "dir"),
    (["synth", "races", "--out"], "dir"),
    (["envs", "build", "--out"], "file"),
    (["config", "-o"], "file"),
    (["view", "{d}", "-o"], "file"),
]


@pytest.fixture(scope="module")
def read_only_dir(tmp_path_factory):
    """A folder nobody may write in: a read-only tmpfs as root (root ignores mode bits), else
    mode 0555."""
    path = tmp_path_factory.mktemp("ro")
    if os.geteuid() != 0:
        path.chmod(0o555)
        yield path
        path.chmod(0o755)
        return
    done = subprocess.run(["mount", "-t", "tmpfs", "-o", "ro,size=64k", "tmpfs", str(path)])
    if done.returncode != 0:
        pytest.skip("cannot mount a read-only tmpfs here (need root and mount rights)")
    yield path
    subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize(
    ("argv", "kind"), OUTPUT_FLAGS, ids=[" ".join(a[:2]) for a, _ in OUTPUT_FLAGS]
)
def test_an_output_path_that_cannot_be_written_is_refused_in_one_line(
    argv, kind, workdir, read_only_dir, capsys
):
    (workdir / "a-file").write_text("mine")
    (workdir / "a-folder").mkdir()
    wrong = "a-file" if kind == "dir" else "a-folder"
    targets = [str(workdir / wrong), str(workdir / "a-file" / "below"), str(read_only_dir / "x")]
    if kind == "file":
        targets.append(str(read_only_dir))
    for target in targets:
        before = _tree(workdir)
        code, out, err = _run([*(a.format(d=workdir) for a in argv), target], capsys)
        _assert_refused(code, out, err, argv[-1], workdir, before)
        assert (workdir / "a-file").read_text() == "mine"


# ------------------------------------------------------------------ what used to be tracebacks


# A synth run with no teacher stage, so that it reaches its input.
NO_TEACHER = [
    "stages.codeify=false",
    "stages.self_correct=false",
    "stages.feedback_alignment=false",
]


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["train", "model.heads=0"], "model.heads must be in [1, 1024]"),
        (["train", "model.hidden_size=130", "model.heads=4"], "divisible by model.heads"),
        (["train", "rl.lr=-1e-4"], "rl.lr must be in (0, 1]"),
        (["train", "sft.lr=.nan"], "sft.lr must be a finite number"),
        (["train", "rl.max_grad_norm=-1"], "rl.max_grad_norm must be > 0"),
        (["train", "sandbox.timeout_s=0"], "sandbox.timeout_s must be in (0, 3600]"),
        (["train", "sandbox.memory_mb=0"], "sandbox.memory_mb must be in [64, 1048576]"),
        (["train", "sandbox.max_output_chars=-1"], "sandbox.max_output_chars"),
        (["train", "rollout_batch=0"], "rollout_batch must be >= 1"),
        (["train", "model.layers=0"], "model.layers"),
        (["train", "model.vocab_size=0"], "model.vocab_size"),
        (["train", "model.max_positions=1"], "model.max_positions"),
        (["train", "model.max_positions=64"], "must exceed the longest model-token limit"),
        (["train", "device=foo"], "device must be a torch device"),
        (["train", 'name=""'], "name must not be empty"),
        (["train", "name=/tmp/x"], "name must be a plain folder name"),
        (["train", "name=../x"], "name must be a plain folder name"),
        (["train", 'name="a\\0b"'], "must not contain a NUL"),
        (["train", "x" * 300 + "=1"], "unknown key"),
        (["eval", "{d}/no-model", "-k", "0"], "argument -k"),
        (["eval", "{d}/no-model", "--limit", "0"], "argument --limit"),
        (["eval", "{d}/no-model", "--max-tokens", "0"], "argument --max-tokens"),
        (["eval", "{d}/no-model", "--temperature", "-1"], "argument --temperature"),
        (["eval", "{d}/no-model"], "no such folder"),
        (["eval", "{d}/empty-model"], "holds no saved model"),
        (["serve", "{d}/empty-model"], "holds no saved model"),
        (["envs", "build", "--out", "{d}/t.jsonl", "--sizes", "50-60"], "sizes must satisfy"),
        (["envs", "check", "-n", "0"], "argument -n"),
        (["view", "{d}/binary.jsonl"], "not a text file"),
        (["view", "{d}/bad.json"], "not a trajectory"),
        # issue 28: each of these was a traceback or was silently accepted
        (["config", "data.train[0].kinds=[]"], "kinds must be a non-empty subset"),
        (["envs", "build", "--out", "{d}/t.jsonl", "--mix", "sequential=nan"], "finite number"),
        (["envs", "build", "--out", "{d}/t.jsonl", "--mix", "sequential=inf"], "finite number"),
        (
            ["synth", "run", "--input", "{d}/binary.jsonl", "--out", "{d}/s", *NO_TEACHER],
            "not UTF-8 text",
        ),
        (
            ["synth", "run", "--input", "{d}/empty.jsonl", "--out", "{d}/s", *NO_TEACHER],
            "holds no records",
        ),
        (["serve", "{d}/empty-model", "--host", "[::1]"], "without brackets"),
        (["serve", "{d}/empty-model", "--host", "127.0.0.1 "], "not an address or host name"),
        (["sandbox", "serve", "--host", "[::1]"], "without brackets"),
        (["eval", "{d}/no-model", "--limit", "2"], "only for --benchmark runs"),
        (["eval", "{d}/no-model", "--out", "{d}/o"], "no such folder"),
        (["eval", "{d}/no-model", "-k", "2", "--temperature", "0"], "greedy decoding"),
        (["eval", "{d}/no-model", "--max-tokens", "9", "eval.max_model_tokens=8"], "disagree"),
        (["eval", "{d}/no-model", "model.name_or_path={d}/other"], "name different models"),
        (["eval", "http://127.0.0.1:9"], "a server URL needs --tokenizer"),
        (["eval", "{d}/no-model", "--tokenizer", "{d}/nope"], "--tokenizer is for a server URL"),
        (["verl", "config", "{d}/verl.yaml", "model.name_or_path={d}/nope"], "no such folder"),
        (["config", "{d}/dup.yaml"], "the key 'lr' appears twice"),
        (["train", "rl.clip_high=0.1"], "rl.clip_high (0.1) must be at least rl.clip_low"),
    ],
)
def test_a_user_error_is_one_line_not_a_traceback(argv, words, workdir, capsys):
    (workdir / "empty-model").mkdir()
    (workdir / "binary.jsonl").write_bytes(b"\x89PNG\r\n\x1a\n\x00\xff\xfe")
    (workdir / "bad.json").write_text("{not json")
    (workdir / "empty.jsonl").write_text("")
    (workdir / "dup.yaml").write_text("rl:\n  lr: 0.1\n  lr: 0.2\n")
    (workdir / "verl.yaml").write_text("variants: [code]\n")
    before = _tree(workdir)
    code, out, err = _run([a.format(d=workdir) for a in argv], capsys)
    _assert_refused(code, out, err, words, workdir, before)


DEEP = "[" * 3000 + "]" * 3000


@pytest.mark.parametrize(
    ("argv", "words"),
    [
        (["train", f"sft.steps={DEEP}"], "nested deeper than 100 levels"),
        (["train", "{d}/deep.yaml"], "deep.yaml:2: nested deeper than 100 levels"),
        (["train", f"seed={'1' * 5000}"], "an integer longer than 100 characters"),
        (["eval", "{d}/no-model", f"sft.steps={DEEP}"], "nested deeper than 100 levels"),
        (["ablate", "--variant", "v:rl.steps=1", f"seed={'1' * 5000}"], "longer than 100"),
        (["ablate", "--variant", f"v:rl.steps={DEEP}"], "variant 'v': override 'rl.steps="),
        (["config", "{d}/big.yaml"], "larger than 10 MB"),
    ],
)
def test_a_config_past_a_parsing_limit_is_one_line_in_every_command(argv, words, workdir, capsys):
    (workdir / "deep.yaml").write_text(f"sft:\n  steps: {DEEP}\n")
    with (workdir / "big.yaml").open("w") as f:
        f.truncate(11 * 2**20)  # sparse: nothing to write, much to refuse
    before = _tree(workdir)
    code, out, err = _run([a.format(d=workdir) for a in argv], capsys)
    _assert_refused(code, out, err, words, workdir, before)


def test_a_config_file_that_is_not_utf8_is_one_line(workdir, capsys):
    (workdir / "bad.yaml").write_bytes(b"name: \xff\xfe\n")
    before = _tree(workdir)
    code, out, err = _run(["train", str(workdir / "bad.yaml")], capsys)
    _assert_refused(code, out, err, "not UTF-8", workdir, before)


def test_config_errors_of_train_come_before_torch_is_imported(tmp_path):
    script = (
        "import sys\nfrom tirl.cli import main\nrc = main(['train', 'model.heads=0'])\n"
        "print('torch' in sys.modules)\nsys.exit(rc)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=60
    )
    assert done.returncode == 2
    assert done.stdout.strip() == "False"  # nothing slow ran before the error
    assert done.stderr.count("\n") == 1 and "model.heads" in done.stderr


def test_an_offline_hub_name_is_one_line(tmp_path):
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    done = subprocess.run(
        [sys.executable, "-m", "tirl.cli", "eval", "no-such-org/no-such-model"],
        capture_output=True,
        text=True,
        cwd=tmp_path,
        env=env,
        timeout=120,
    )
    assert done.returncode == 2, done.stderr
    assert done.stderr.count("\n") == 1 and "cannot load model" in done.stderr
    assert "Traceback" not in done.stderr


def test_a_device_this_machine_lacks_is_one_line(workdir, capsys):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU, so device=cuda is valid here")
    before = _tree(workdir)
    code, out, err = _run(["train", "rl.bf16=true"], capsys)
    _assert_refused(code, out, err, "rl.bf16", workdir, before)
    for command in ("train", "config"):  # `tirl config` refuses it as `train` would
        code, out, err = _run([command, "device=cuda"], capsys)
        _assert_refused(code, out, err, "device 'cuda' is not available", workdir, before)
