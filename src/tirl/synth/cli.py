"""`tirl synth run | races | report`: trajectory synthesis from the command line.

Wired into the `tirl` command by `tirl.cli`. User errors (a bad config value, a missing input
file, a bad record, an unreachable teacher) are one line on stderr, exit code 2 (ConfigError,
printed by `tirl.cli.main`) or 1 (the teacher failed; rerun with --resume).
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
from pathlib import Path

from tirl.cliargs import number, output_dir
from tirl.config import ConfigError, load_config
from tirl.sandbox.formatter import SHOWN_OUTPUT_CHARS


def _split(args: argparse.Namespace) -> tuple[str | None, list[str]]:
    """`tirl synth run a.yaml x=1` or `tirl synth run x=1`: the config path is optional."""
    items = list(args.config_and_overrides)
    if items and "=" not in items[0]:
        return items[0], items[1:]
    return None, items


def cmd_run(args: argparse.Namespace) -> int:
    from tirl.synth.client import RequestBudgetExceeded, TeacherError
    from tirl.synth.config import SynthConfig
    from tirl.synth.pipeline import run_pipeline
    from tirl.synth.records import check_input_file

    path, overrides = _split(args)
    cfg = load_config(SynthConfig, path, overrides)
    if not args.input.startswith("hf:"):
        if not Path(args.input).is_file():
            raise ConfigError(f"--input {args.input}: no such file")
        check_input_file(args.input)  # not UTF-8, or no record: one line, nothing written
    try:
        out = run_pipeline(cfg, args.input, args.out, args.resume, args.max_requests)
    except (TeacherError, RequestBudgetExceeded) as e:
        print(f"tirl: error: {e} (finished items are saved; rerun with --resume)", file=sys.stderr)
        return 1
    print((out / "report.md").read_text())
    print(f"wrote {out / 'trajectories.jsonl'}, {out / 'report.md'}, {out / 'report.html'}")
    return 0


def cmd_races(args: argparse.Namespace) -> int:
    from tirl.envs.dataset import parse_sizes
    from tirl.synth.races import run_races

    try:
        sizes = parse_sizes(args.sizes)
    except ValueError as e:
        raise ConfigError(f"--sizes: {e}") from None
    from tirl.protocol import PROTOCOLS
    from tirl.synth.races import RACES_SANDBOX

    if (problem := PROTOCOLS.problem(args.format)) is not None:
        raise ConfigError(f"--format {args.format}: {problem}")

    sandbox_cfg = dataclasses.replace(RACES_SANDBOX, max_output_chars=args.max_output_chars)
    out = run_races(
        args.out, args.n, args.seed, sizes, args.level, args.split, args.format, sandbox_cfg
    )
    print((out / "report.md").read_text())
    print(f"wrote {out / 'trajectories.jsonl'}")
    return 0


def cmd_report(args: argparse.Namespace) -> int:
    from tirl.synth.report import write_report

    out = Path(args.dir)
    if not (out / "stages").is_dir():
        raise ConfigError(f"{out} is not a synth run folder (it has no stages/)")
    paths = write_report(out)
    print(paths[0].read_text())
    print("wrote " + ", ".join(map(str, paths)))
    return 0


def add_synth_parser(sub) -> None:
    synth = sub.add_parser(
        "synth", help="synthesize tool-integrated SFT trajectories (teacher or RACES)"
    )
    synth_sub = synth.add_subparsers(dest="synth_command", required=True, metavar="COMMAND")
    synth.set_defaults(config=None, overrides=[])

    p = synth_sub.add_parser(
        "run",
        help="the AgentMath pipeline over a dataset of (problem, CoT, answer) records",
        description="Decontaminate, code-ify with a teacher, correct the format, execute, inject"
        " self-correction, replace outputs, align feedback with a judge, limit code, check"
        " answers. Writes OUT/trajectories.jsonl, OUT/report.md and OUT/report.html.",
    )
    p.add_argument(
        "config_and_overrides",
        nargs="*",
        metavar="CONFIG [KEY=VALUE ...]",
        help="YAML config (optional), then dotted overrides, e.g. teacher.url=http://127.0.0.1:8000",
    )
    p.add_argument("--input", required=True, help="JSONL, Parquet, or hf:<owner>/<dataset>")
    p.add_argument("--out", type=output_dir, required=True, help="output folder")
    p.add_argument("--resume", action="store_true", help="continue the run in --out")
    p.add_argument(
        "--max-requests",
        type=number(int, ">= 1"),
        help="stop after sending this many requests (a dry run)",
    )
    p.set_defaults(func=cmd_run)

    p = synth_sub.add_parser(
        "races", help="teacher-free trajectories: RACES composites rendered as code and executed"
    )
    p.add_argument("--out", type=output_dir, required=True, help="output folder")
    p.add_argument(
        "-n", type=number(int, ">= 1"), default=100, help="composites to try (default 100)"
    )
    p.add_argument("--seed", type=number(int, ">= 0"), default=0)
    p.add_argument("--sizes", default="2-4", help="composition sizes in 1..12, e.g. 2-4 (default)")
    p.add_argument("--level", type=int, default=1, choices=(1, 2, 3))
    p.add_argument("--split", default="train", choices=("train", "test"))
    p.add_argument(
        "--format",
        default="agentmath_tags",
        help="the protocol the demonstrations are written in: a registered protocol"
        " (agentmath_tags, cir_fences or a plugin's; default agentmath_tags)",
    )
    p.add_argument(
        "--max-output-chars",
        type=number(int, "[16, 10000000]"),
        default=SHOWN_OUTPUT_CHARS,
        help="interpreter output the demonstrations show, in characters; train with the same"
        f" sandbox.max_output_chars (default {SHOWN_OUTPUT_CHARS})",
    )
    p.set_defaults(func=cmd_races)

    p = synth_sub.add_parser("report", help="rewrite the report of a synth run folder")
    p.add_argument("dir", help="the --out folder of a run")
    p.set_defaults(func=cmd_report)
