"""`tirl study races`: RACES's composition study on a tiny model
(`tirl.studies.races_study`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.cli.common import add_config_args, preset_path
from tirl.cliargs import output_dir, require_device
from tirl.config import load_config


def cmd_study_races(args: argparse.Namespace) -> int:
    """`tirl study races [CONFIG] [overrides]`: RACES's composition study on a tiny model."""
    from tirl.studies.races_study import RacesStudyConfig

    cfg = load_config(RacesStudyConfig, args.config or preset_path("races_study"), args.overrides)
    require_device(cfg.run.device)
    from tirl.apps.evaluation import evaluation
    from tirl.studies.races_report import write_study_report
    from tirl.studies.races_study import run_study

    out = Path(args.out)
    results = run_study(cfg, out, evaluation(), write_study_report)
    for variant, claims in results["claims"].items():
        verdicts = ", ".join(f"{i + 1}: {c['verdict']}" for i, c in enumerate(claims))
        print(f"{variant}: claims {verdicts}")
    print(f"\nstudy folder: {out}\nreport: {out / 'study.md'}  and {out / 'report.html'}")
    return 0


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
        " SEQUENTIAL sizes 2-5) from one SFT model per variant over several seeds, evaluate on"
        " held-out atomic tasks and compositions, and judge the paper's four claims. Config keys:"
        " study.* and run.* (default: the bundled races_study preset).",
    )
    add_config_args(p)
    p.add_argument(
        "--out", type=output_dir, default="runs/races_study",
        help="study folder (default runs/races_study)",
    )  # fmt: skip
    p.set_defaults(func=cmd_study_races)
