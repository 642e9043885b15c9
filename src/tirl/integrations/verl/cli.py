"""`tirl verl ...`: the plugin's subcommands (verl itself is not needed to run them).

    tirl verl data CONFIG [KEY=VALUE ...] --split train|test --n N --out FILE.parquet [--force]
    tirl verl sft-data SYNTH_FILE --out FILE.parquet [--protocol P] [--boundary B] [--force]

`add_parser(subparsers)` adds `verl` to `tirl`'s subcommands; each subcommand is one
`add_*_parser(verl_subparsers)` call in it, so another (the config translation) is one more
line there. Like every tirl subcommand, a user error is a `ConfigError`, which `tirl.cli.main`
prints as one line on stderr with exit code 2; the commands parse, call
`tirl.integrations.verl.data` and print one line.
"""

from __future__ import annotations

import argparse

from tirl.cliargs import input_path, number, output_file
from tirl.config import ConfigError
from tirl.protocol import PROTOCOLS, Boundary


def cmd_data(args: argparse.Namespace) -> int:
    from tirl.integrations.verl.data import export_tasks

    if args.config is None:  # `tirl.cli` moves a lone KEY=VALUE out of the config slot
        raise ConfigError("name the tirl run config whose tasks to export (tirl verl data CONFIG)")
    if args.split == "train" and args.n is None:
        raise ConfigError("--n: say how many train tasks to export")
    if args.split == "test" and args.start:
        raise ConfigError("--start is for the train split (eval sets start at their first item)")
    summary = export_tasks(
        args.config,
        args.split,
        args.n,
        args.out,
        overrides=args.overrides,
        start=args.start,
        force=args.force,
        agent_name=args.agent_name,
    )
    print(summary.line())
    return 0


def cmd_sft_data(args: argparse.Namespace) -> int:
    from tirl.integrations.verl.data import export_sft

    summary = export_sft(
        args.synth_file,
        args.out,
        args.protocol,
        boundary=args.boundary,
        system=args.system,
        force=args.force,
    )
    print(summary.line())
    return 0


def _add_out_args(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--out", type=output_file, required=True, help="the parquet file to write (*.parquet)"
    )
    p.add_argument("--force", action="store_true", help="replace --out if it exists")


def add_data_parser(sub) -> None:
    p = sub.add_parser(
        "data",
        help="export a config's tasks (arithmetic, RACES, datasets, benchmarks) as verl RL parquet",
        description="Write the tasks of a tirl run config as rows verl's RLHFDataset reads:"
        " data_source, prompt (chat messages with the protocol's system prompt), ability,"
        " reward_model.ground_truth, extra_info (the serialized task, protocol and prompt"
        " settings, read by tirl's agent loop) and agent_name. train: --n items of the"
        " data.train mixture from --start; test: every data.eval set (data_source = its name).",
    )
    p.add_argument("config", help="a tirl run config (YAML), as tirl train takes")
    p.add_argument(
        "overrides", nargs="*", help="dotted overrides after CONFIG, e.g. data.train[0].digits=4"
    )
    p.add_argument(
        "--split",
        choices=("train", "test"),
        default="train",
        help="train: the data.train mixture; test: the data.eval sets (default train)",
    )
    p.add_argument(
        "--n",
        type=number(int, ">= 1"),
        help="train: how many tasks (required; a finite source cycles); test: at most this many"
        " per eval set (default: each set's items)",
    )
    p.add_argument(
        "--start",
        type=number(int, ">= 0"),
        default=0,
        help="train: the first mixture position, to skip the items tirl's SFT used: sft.examples,"
        " or with sft.stages the position past every stage's items"
        " (tirl.train.pipeline.first_rl_position; default 0)",
    )
    p.add_argument(
        "--agent-name",
        default="tirl",
        help="the verl agent loop that runs the rows (default tirl)",
    )
    _add_out_args(p)
    p.set_defaults(func=cmd_data)


def add_sft_data_parser(sub) -> None:
    p = sub.add_parser(
        "sft-data",
        help="export a tirl synth file as verl multi-turn SFT parquet (interpreter output masked)",
        description="Write each record of a tirl synth run / synth races file as verl's"
        " multi-turn messages: system, user, then the model's text up to each code block as an"
        " assistant turn and the interpreter's output as a tool turn (verl gives it loss 0),"
        " ending with the model's answer. See tirl.integrations.verl.data for what this form"
        " changes against tirl's single assistant turn.",
    )
    p.add_argument("synth_file", type=input_path, help="trajectories.jsonl of tirl synth")
    p.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        help="the protocol every record must be written in (default: each record's own)",
    )
    p.add_argument(
        "--boundary",
        choices=[b.value for b in Boundary],
        default=Boundary.EXACT_MATCH.value,
        help="where a model turn ends: at the block's close, or after its stop marker"
        " (as protocol.boundary; default exact_match)",
    )
    p.add_argument(
        "--system",
        help="the system message (default: the protocol's own, as tirl's chat prompts; '' for"
        " none)",
    )
    _add_out_args(p)
    p.set_defaults(func=cmd_sft_data)


def add_parser(subparsers):
    """Add `tirl verl` and its subcommands to `tirl`'s subparsers; returns the `verl`
    subparsers, so a caller can add one more (`add_x_parser(returned)`)."""
    verl = subparsers.add_parser(
        "verl",
        help="tirl as a verl plugin: tasks and SFT data as verl parquet, launch overrides",
        description="Run tirl's training on verl: data in verl's formats (the agent loop and"
        " the rest of the plugin live in tirl.integrations.verl).",
    )
    verl.set_defaults(config=None, overrides=[])  # what tirl.cli.main expects of every command
    sub = verl.add_subparsers(dest="verl_command", required=True, metavar="COMMAND")
    add_data_parser(sub)
    add_sft_data_parser(sub)
    add_config_parser(sub)
    return sub


def add_config_parser(sub) -> None:
    p = sub.add_parser(
        "config",
        help="translate a tirl run config into verl launch overrides",
        description="Print the Hydra overrides of verl's ppo_trainer that run CONFIG's RL on"
        " verl with tirl's agent loop (every rl key is mapped, handled by the loop, or refused"
        " with the reason; tirl.integrations.verl.config_table.MAPPING).",
    )
    p.add_argument("config", help="a tirl run config (YAML) with model.name_or_path set")
    p.add_argument("overrides", nargs="*", help="dotted overrides of CONFIG, e.g. rl.lr=1e-6")
    p.add_argument(
        "--format",
        choices=("lines", "shell", "yaml"),
        default="lines",
        help="one override per line (default), a whole `python -m verl.trainer.main_ppo`"
        " command, or a Hydra config file composing ppo_trainer",
    )
    p.set_defaults(func=cmd_config)


def cmd_config(args) -> int:
    from tirl.integrations.verl.config import run_config_command

    return run_config_command(args.config, args.overrides, args.format)
