"""`tirl study races`: RACES's composition study (the tiny model or SmolLM2)
(`tirl.studies.races_study`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.cli.common import add_config_args, load_study_config, preset_path
from tirl.cliargs import output_dir, require_device
from tirl.config import ConfigError


def cmd_study_races(args: argparse.Namespace) -> int:
    """`tirl study races [CONFIG] [--quick] [--resume] [overrides]`: RACES's composition study;
    with `--report-only`, the report of a study folder again, without training (of a study
    stopped midway, on the arms that finished)."""
    from tirl.studies.races_report import finished_problem, write_study_report

    out = Path(args.out)
    if args.report_only and (args.sft_from or args.resume or args.quick):
        given = "--sft-from" if args.sft_from else "--resume" if args.resume else "--quick"
        raise ConfigError(f"--report-only trains nothing; {given} is for a study that trains")
    if args.report_only:
        problem = finished_problem(out)
        if problem:
            raise ConfigError(f"--report-only: {out} has no study to report ({problem})")
        _print_summary(write_study_report(out), out)
        return 0
    from tirl.studies.races_study import RacesStudyConfig

    config = args.config or preset_path("races_study")
    cfg = load_study_config(RacesStudyConfig, config, args.overrides, args.quick)
    require_device(cfg.run.device)
    from tirl.apps.evaluation import evaluation
    from tirl.studies.races_study import run_study

    sft_from = Path(args.sft_from) if args.sft_from else None
    results = run_study(cfg, out, evaluation(), write_study_report, sft_from, args.resume)
    _print_summary(results, out)
    return 0


def _print_summary(results: dict, out: Path) -> None:
    """The claims' verdicts and the arms that beat their SFT start, per variant."""
    for variant, claims in results["claims"].items():
        verdicts = ", ".join(f"{i + 1}: {c['verdict']}" for i, c in enumerate(claims))
        print(f"{variant}: claims {verdicts}")
    for variant in results["claims"]:
        for label, key in (
            ("held-out", "verdict"),
            ("held-out compositions", "compositions_verdict"),
        ):
            beat = [
                name.split("/")[1]
                for name, row in results["arms"].items()
                if name.startswith(f"{variant}/") and row["vs_sft"][key] == "beats its SFT start"
            ]
            print(
                f"{variant}: arms that beat their SFT start on {label}: {', '.join(beat) or 'none'}"
            )
    print(f"\nstudy folder: {out}\nreport: {out / 'study.md'}  and {out / 'report.html'}")


def add_parser(sub) -> None:
    study = sub.add_parser(
        "study",
        help="studies that reproduce a paper's comparison at small scale",
        description="Studies that reproduce a paper's comparison at small scale.",
    )
    study_sub = study.add_subparsers(dest="study_command", required=True, metavar="STUDY")
    p = study_sub.add_parser(
        "races",
        help="RACES: individual vs composed environments, RACES-small, a size sweep; one report",
        description="Train the arms of RACES's composition study (individual, RACES, RACES-small,"
        " SEQUENTIAL sizes 2-5, and a pass-rate curriculum over sizes 1-5) from one SFT model"
        " per variant over several seeds, evaluate on held-out atomic tasks and compositions,"
        " and judge the paper's four claims. Config keys: study.* and run.* (default: the"
        " bundled races_study preset).",
    )
    add_config_args(p, default="races_study.yaml")
    p.add_argument(
        "--out", type=output_dir, default="runs/races_study",
        help="study folder (default runs/races_study)",
    )  # fmt: skip
    p.add_argument(
        "--report-only", action="store_true",
        help="write the report of the study in --out again, without training (a study"
        " stopped midway: on the arms that finished)",
    )  # fmt: skip
    p.add_argument(
        "--sft-from", metavar="FOLDER",
        help="start every arm from the SFT model of the study in FOLDER instead of training"
        " one: to change RL or evaluation settings without repeating SFT (refused unless"
        " FOLDER's SFT start was made from the same settings and task sets)",
    )  # fmt: skip
    p.add_argument(
        "--quick", action="store_true",
        help="the same study shrunk (fewer steps, items, arms, one seed): the config's"
        " study.quick overrides, applied before the command's own",
    )  # fmt: skip
    p.add_argument(
        "--resume", action="store_true",
        help="continue the killed study in --out (same config, overrides and --quick): a"
        " finished SFT, arm or evaluation is not redone; an arm killed mid-RL continues from"
        " its last checkpoint (run.rl.checkpoint_every) or starts over",
    )  # fmt: skip
    p.set_defaults(func=cmd_study_races)
    from tirl.cli import study_synth

    study_synth.add_parser(study_sub)
