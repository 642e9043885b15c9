"""`tirl config`: the resolved run config, printed or written, or every key with its default,
range and meaning (`tirl.config.describe`)."""

from __future__ import annotations

import argparse
import json
import textwrap

from tirl.cli.common import add_config_args, load_run_config
from tirl.cliargs import output_file, require_device
from tirl.config import describe, dump_yaml, to_dict


def _print_keys(rows) -> None:
    for row in rows:
        if row.type == "section":
            print(f"\n{row.key}: {row.doc}")
            continue
        bounds = f"  range {row.range}" if row.range else ""
        print(f"  {row.key} = {json.dumps(row.default)}  ({row.type}){bounds}")
        if row.doc:
            print(f"      {row.doc}")


def _print_registered() -> None:
    from tirl.train.registries import registered

    print("\nregistered: what each extension point's key may name (plugins included)")
    for point, names in registered().items():
        text = textwrap.fill(", ".join(names), 100, initial_indent="    ", subsequent_indent="    ")
        print(f"\n  {point}:\n{text}")


def cmd_config(args: argparse.Namespace) -> int:
    if args.keys:
        from tirl.run.config import RunConfig
        from tirl.tasks.registry import SOURCES, source_names

        if args.config or args.overrides:  # its plugins' entries are listed too
            load_run_config(args.config, args.overrides)
        _print_keys(describe(RunConfig))
        print("\ntask sources: the keys of a data.train / data.eval entry {source: NAME, ...}")
        for name in source_names():
            print(f"\n  source: {name}  ({(SOURCES[name].__doc__ or '').strip().splitlines()[0]})")
            fields = [r for r in describe(SOURCES[name]) if r.key != "name"]
            _print_keys(fields)
        _print_registered()
        return 0
    cfg = load_run_config(args.config, args.overrides)
    require_device(cfg.device)  # as `tirl train` would: a config for a device this machine lacks
    if args.output:
        dump_yaml(cfg, args.output)
    else:
        import yaml

        print(yaml.safe_dump(to_dict(cfg), sort_keys=False), end="")
    return 0


def add_parser(sub) -> None:
    p = sub.add_parser("config", help="print (or write) the resolved config")
    add_config_args(p)
    p.add_argument(
        "-o",
        "--output",
        type=output_file,
        help="write the resolved YAML here instead of printing it",
    )
    p.add_argument(
        "--keys",
        "--help-fields",
        action="store_true",
        help="list every key with its default, range and meaning, each task source's keys, and"
        " what every extension point has registered (with CONFIG: its plugins' too)",
    )
    p.set_defaults(func=cmd_config)
