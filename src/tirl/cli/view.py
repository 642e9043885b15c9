"""`tirl view PATH`: an HTML viewer of trajectories (`tirl.eval.viewer`)."""

from __future__ import annotations

import argparse

from tirl.cliargs import check_model_source, input_path, output_file
from tirl.config import ConfigError


def cmd_view(args: argparse.Namespace) -> int:
    from tirl.eval.viewer import find_tokenizer, load_trajectories, write_viewer

    path = args.path
    try:
        trajs = load_trajectories(path)
    except ValueError as e:
        raise ConfigError(str(e)) from None
    if not trajs:
        raise ConfigError(f"{path} holds no trajectories")
    tokenizer = None
    if args.tokenizer:
        from transformers import AutoTokenizer

        from tirl.models.tiny import loading

        check_model_source(args.tokenizer, "--tokenizer", need_weights=False)
        tokenizer = loading(args.tokenizer, AutoTokenizer.from_pretrained)
    elif path.is_dir():
        tokenizer = find_tokenizer(path)
    out = args.output or (path if path.is_dir() else path.parent) / "viewer.html"
    write_viewer(trajs, out, f"tirl trajectories: {path}", tokenizer=tokenizer)
    print(f"wrote {out} ({len(trajs)} trajectories)")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser(
        "view", help="write an HTML viewer of trajectories (model vs interpreter tokens, loss mask)"
    )
    p.add_argument(
        "path", type=input_path, help="a run folder, or a .jsonl of trajectories / eval samples"
    )
    p.add_argument("--tokenizer", help="tokenizer folder or hub name, to show token boundaries")
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        help="the HTML file (default: viewer.html beside the input)",
    )
    p.set_defaults(func=cmd_view, config=None, overrides=[])
