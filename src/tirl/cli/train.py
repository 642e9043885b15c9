"""`tirl train [CONFIG]` and `tirl quickstart` (the bundled quickstart preset; with `--model`,
the bundled real-model preset): the training pipeline, `tirl.train.pipeline.run_training`."""

from __future__ import annotations

import argparse

from tirl.cli.common import (
    REAL_MODEL_PRESET,
    add_config_args,
    add_resume_arg,
    load_run_config,
    with_model,
)
from tirl.cliargs import check_model_source, require_device


def cmd_train(args: argparse.Namespace) -> int:
    config, overrides = with_model(args.config, args.overrides, getattr(args, "model", None))
    cfg = load_run_config(config, overrides)  # before torch: errors come at once
    if cfg.model.name_or_path:  # a server engine needs the model's tokenizer only
        from tirl.rollout.engines import ENGINES

        weights = ENGINES.get_entry(cfg.rollout.engine).receives_weights
        check_model_source(cfg.model.name_or_path, "model.name_or_path", need_weights=weights)
    require_device(cfg.device)
    from tirl.train.run_folder import check_run_folder

    check_run_folder(cfg.out_dir, cfg.name, resume=args.resume)
    from tirl.apps.agents import agent_rollout
    from tirl.apps.evaluation import evaluation
    from tirl.train.pipeline import run_training

    run_dir, results = run_training(cfg, evaluation(), resume=args.resume, agents=agent_rollout)
    print(f"\nrun folder: {run_dir}\nreport:     {run_dir / 'report.html'}  (and report.md)")
    print(f"wall time:  {results['wall_s']:.0f} s")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "quickstart",
        help="SFT -> RL -> eval of a tiny code-integrated model and a text-only baseline, with a report",
        description="Run the whole loop on CPU: demonstrations, SFT, RL with the interpreter, evaluation, report.",
    )
    add_config_args(p)
    p.add_argument(
        "--model",
        help="a pretrained instruct model (smollm2-135m-instruct, a .gguf file, a folder or a"
        f" hub name): the bundled {REAL_MODEL_PRESET}.yaml preset instead of the tiny model"
        " (LoRA SFT on code demonstrations in the model's chat template, then CIR's RL;"
        " about 15 min on 2 quiet cores for SmolLM2-135M)",
    )
    add_resume_arg(p)
    p.set_defaults(func=cmd_train)

    p = sub.add_parser(
        "train",
        help="the training pipeline (demonstrations -> SFT -> eval -> RL -> eval -> report) from"
        " a config: any task sources, engine and protocol",
        description="Run the pipeline a config describes (recipes/ holds examples; every key:"
        " tirl config --keys). Without a config, the bundled quickstart preset.",
    )
    add_config_args(p)
    add_resume_arg(p)
    p.set_defaults(func=cmd_train)
