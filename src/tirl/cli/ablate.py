"""`tirl ablate`: RL under several switch combinations from one SFT model
(`tirl.studies.ablate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.cli.common import add_config_args, load_run_config
from tirl.cliargs import number, output_dir, require_device


def cmd_ablate(args: argparse.Namespace) -> int:
    cfg = load_run_config(args.config, args.overrides)
    require_device(cfg.device)
    from tirl.apps.evaluation import evaluation
    from tirl.studies.ablate import PRESET_NOTES, parse_variants, run_ablation

    variants = parse_variants(args.preset, args.variant or [])
    note = PRESET_NOTES.get(args.preset or "", "")
    out = run_ablation(cfg, variants, args.seeds, Path(args.out), evaluation(), note)
    print(f"\nablation folder: {out}\ntable: {out / 'ablation.md'}  curves: {out / 'report.html'}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ablate",
        help="RL under several switch combinations from one SFT model, same seeds, one report",
        description="Fine-tune once per seed, then run RL for every variant (a list of config"
        " overrides) and compare them on the held-out split. Presets: cir (each of CIR's six"
        " strategies removed in turn), agentmath, advantages.",
    )
    add_config_args(p)
    p.add_argument("--preset", help="cir, agentmath or advantages")
    p.add_argument(
        "--variant",
        action="append",
        help="NAME:key=value[,key=value...] (repeatable), added to the preset's variants",
    )
    p.add_argument(
        "--seeds", type=number(int, ">= 0"), nargs="+", default=[0], help="seeds (default: 0)"
    )
    p.add_argument(
        "--out", type=output_dir, default="runs/ablate", help="output folder (default runs/ablate)"
    )
    p.set_defaults(func=cmd_ablate)
