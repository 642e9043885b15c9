"""`tirl ablate`: RL under several switch combinations from one SFT model
(`tirl.studies.ablate`)."""

from __future__ import annotations

import argparse
from pathlib import Path

from tirl.cli.common import (
    REAL_MODEL_PRESET,
    add_config_args,
    add_resume_arg,
    load_run_config,
    with_model,
)
from tirl.cliargs import check_model_source, number, output_dir, require_device


def cmd_ablate(args: argparse.Namespace) -> int:
    config, overrides = with_model(args.config, args.overrides, args.model)
    cfg = load_run_config(config, overrides)
    if cfg.model.name_or_path:
        check_model_source(cfg.model.name_or_path, "model.name_or_path", need_weights=True)
    require_device(cfg.device)
    from tirl.apps.evaluation import evaluation
    from tirl.studies.ablate import PRESET_NOTES, parse_variants, quick_config, run_ablation

    variants = parse_variants(args.preset, args.variant or [])
    seeds = args.seeds
    if args.quick:
        cfg, seeds = quick_config(cfg), seeds[:1]
    note = PRESET_NOTES.get(args.preset or "", "")
    out = run_ablation(cfg, variants, seeds, Path(args.out), evaluation(), note, args.resume)
    print(f"\nablation folder: {out}\ntable: {out / 'ablation.md'}  curves: {out / 'report.html'}")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "ablate",
        help="RL under several switch combinations from one SFT model, same seeds, one report",
        description="Fine-tune once per seed, then run RL for every variant (a list of config"
        " overrides) and compare them on the held-out split. Presets: cir (each of CIR's six"
        " strategies removed in turn), cir-claims (the full recipe against text-only,"
        " stop-token boundaries, tool output trained on and a fixed budget, each CIR claim"
        " judged with a paired bootstrap CI), agentmath, advantages.",
    )
    add_config_args(p)
    p.add_argument("--preset", help="cir, cir-claims, agentmath or advantages")
    p.add_argument(
        "--variant",
        action="append",
        help="NAME:key=value[,key=value...] (repeatable), added to the preset's variants",
    )
    p.add_argument(
        "--seeds", type=number(int, ">= 0"), nargs="+", default=[0], help="seeds (default: 0)"
    )
    p.add_argument(
        "--model",
        help="a pretrained instruct model (smollm2-135m-instruct, a .gguf file, a folder or a"
        f" hub name): the bundled {REAL_MODEL_PRESET}.yaml recipe with it as the base config",
    )
    p.add_argument(
        "--quick",
        action="store_true",
        help="the same ablation shrunk for a look or CI: the first seed only, at most 4 RL"
        " steps per variant and 50 held-out items per set (SFT as configured)",
    )
    p.add_argument(
        "--out", type=output_dir, default="runs/ablate", help="output folder (default runs/ablate)"
    )
    add_resume_arg(p, "the ablation in --out, given the same command")
    p.set_defaults(func=cmd_ablate)
