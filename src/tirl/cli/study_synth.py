"""`tirl study synth`: AgentMath's synthesis with a real teacher (`tirl.studies.synth_study`)."""

from __future__ import annotations

import argparse
import shlex
import sys
from pathlib import Path

from tirl.cli.common import add_config_args, load_study_config, preset_path
from tirl.cliargs import output_dir, require_device


def cmd_study_synth(args: argparse.Namespace) -> int:
    """`tirl study synth [CONFIG] [overrides] [--quick] [--resume] --out DIR`."""
    from tirl.studies.synth_config import SynthStudyConfig, problem_sources

    config = args.config or preset_path("synth_study")
    cfg = load_study_config(SynthStudyConfig, config, args.overrides, args.quick)
    require_device(cfg.run.device)
    problem_sources(cfg)  # a bad source is one line, before torch is imported
    from tirl.apps.evaluation import evaluation
    from tirl.studies.synth_report import write_study_report
    from tirl.studies.synth_study import run_study
    from tirl.synth.client import RequestBudgetExceeded, TeacherError

    out = Path(args.out)
    command = "tirl " + " ".join(shlex.quote(a) for a in sys.argv[1:])
    ev = evaluation()
    try:
        results = run_study(
            cfg, out, ev, lambda folder: write_study_report(folder, ev, command), args.resume
        )
    except (TeacherError, RequestBudgetExceeded) as e:
        print(f"tirl: error: {e} (finished items are saved; rerun with --resume)", file=sys.stderr)
        return 1
    arms = results["arms"]
    for arm, row in arms.items():
        acc = row["rl"]["correct"]
        print(
            f"{arm}: {row['sft_examples']} SFT demonstrations, held-out accuracy after RL"
            f" {acc['mean']:.3f} [{acc['ci'][0]:.3f}, {acc['ci'][1]:.3f}]"
        )
    print(f"verdict: {results['verdict']}: {results['why']}")
    print(f"\nstudy folder: {out}\nreport: {out / 'study.md'}  and {out / 'report.html'}")
    return 0


def add_parser(study_sub) -> None:
    p = study_sub.add_parser(
        "synth",
        help="AgentMath: SFT on a served teacher's synthesized trajectories vs scripted vs none",
        description="Serve the teacher with `tirl serve` on loopback, synthesize tool-integrated"
        " trajectories from reasoning-gym problems with `tirl synth`'s stages (pass rate and time"
        " per stage), then train three arms from the same base model, each followed by the same"
        " RL: SFT on the synthesized trajectories, SFT on tirl's scripted demonstrations, no SFT;"
        " compare them on the same held-out items with paired bootstrap CIs, and judge"
        " AgentMath's claim. Config keys: study.*, teacher.*, stages.*, limits.*, run.*"
        " (default: the bundled synth_study preset, SmolLM2-135M-Instruct as teacher and"
        " student).",
    )
    add_config_args(p, default="synth_study.yaml")
    p.add_argument(
        "--out", type=output_dir, default="runs/synth_study",
        help="study folder (default runs/synth_study)",
    )  # fmt: skip
    p.add_argument(
        "--quick",
        action="store_true",
        help="the same study shrunk: the config's study.quick overrides, applied before the"
        " command's own (by default 32 problems, 30 held-out items, SFT 6 steps, RL 2 steps of 2"
        " prompts); a resume needs it again",
    )
    p.add_argument(
        "--resume",
        action="store_true",
        help="continue the study in --out: the teacher's answers come from the caches, finished"
        " synthesis stages, SFT, RL and evaluations are not redone",
    )
    p.set_defaults(func=cmd_study_synth)
