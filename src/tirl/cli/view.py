"""`tirl view PATH`: an HTML viewer of trajectories (`tirl.eval.viewer`)."""

from __future__ import annotations

import argparse
import sys
import warnings
from pathlib import Path

from tirl.cliargs import check_model_source, input_path, output_file
from tirl.config import ConfigError


def cmd_view(args: argparse.Namespace) -> int:
    from tirl.eval.viewer import find_tokenizer, write_viewer

    path = args.path
    trajs = _load(path)
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


def _load(path: Path) -> list:
    """The trajectories at `path`, or a one-line error. Lines or files skipped on the way are
    one line each ("tirl view: warning: ..."), not Python's two-line warnings, and are left out
    when nothing could be read: the error says it then."""
    from tirl.eval.viewer import load_trajectories

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            trajs = load_trajectories(path)
        except ValueError as e:
            raise ConfigError(" ".join(str(e).split())) from None
    notes = [" ".join(str(w.message).split()) for w in caught]
    if not trajs:
        raise ConfigError(f"{path} holds no trajectories" + (f" ({notes[0]})" if notes else ""))
    for note in notes:
        print(f"tirl view: warning: {note}", file=sys.stderr)
    return trajs


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
