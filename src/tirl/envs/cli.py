"""`tirl envs list | show | sample | build | check`: the RACES library from the command line.

Wired into the `tirl` command by `tirl.cli`. User errors (an unknown environment, a bad mixture
or size range) raise `ConfigError`, which `tirl.cli.main` prints as one line with exit code 2.
"""

from __future__ import annotations

import argparse
import importlib
import random
import sys

from tirl.cliargs import number, output_file
from tirl.config import ConfigError


def _registry():
    from tirl.envs.registry import REGISTRY

    return REGISTRY


def _get(name: str):
    try:
        return _registry().get(name)
    except KeyError as e:
        raise ConfigError(e.args[0]) from None


def cmd_list(args: argparse.Namespace) -> int:
    registry = _registry()
    envs = sorted(registry, key=lambda e: e.name)
    if args.domain:
        envs = [e for e in envs if e.domain == args.domain]
        if not envs:
            raise ConfigError(
                f"no domain {args.domain!r}; domains: {', '.join(registry.domains())}"
            )
    for e in envs:
        print(f"{e.name:40s} {e.input.name:>9s} -> {e.output.name:<9s} {e.instruction}")
    counts = ", ".join(f"{d} {n}" for d, n in registry.domains().items())
    print(f"\n{len(envs)} environments shown; the library has {len(registry)} ({counts})")
    if args.types:
        print("\ntype graph (input kind -> output kind: environments):")
        for (a, b), n in registry.type_graph().items():
            print(f"  {a:>9s} -> {b:<9s} {n}")
    return 0


def cmd_show(args: argparse.Namespace) -> int:
    env = _get(args.name)
    x = env.sample(random.Random(args.seed), args.level)
    print(f"{env.name}  ({env.input.name} -> {env.output.name}, domain {env.domain})\n")
    print(f"input type:  {env.input!r}\noutput type: {env.output!r}\n")
    print("code rendering:\n" + env.code)
    print("a problem:\n" + env.describe(x) + "\n")
    print("its answer: " + env.output.render(env.apply(x)))
    return 0


def cmd_sample(args: argparse.Namespace) -> int:
    env = _get(args.name)
    rng = random.Random(args.seed)
    for i in range(args.n):
        x = env.sample(rng, args.level)
        print(f"--- {i + 1}\n{env.describe(x)}\nanswer: {env.output.render(env.apply(x))}")
    return 0


def cmd_build(args: argparse.Namespace) -> int:
    from tqdm import tqdm

    from tirl.envs.dataset import BuildConfig, build_tasks, parse_mixture, parse_sizes, write_tasks

    try:
        lo, hi = parse_sizes(args.sizes)
        mixture = parse_mixture(args.mix) if args.mix else None
        config = BuildConfig(
            n=args.n,
            seed=args.seed,
            split=args.split,
            min_size=lo,
            max_size=hi,
            level=args.level,
            inputs_per_composite=args.inputs_per_composite,
            **({"mixture": mixture} if mixture is not None else {}),
        )
    except ValueError as e:
        raise ConfigError(str(e)) from None
    tasks = build_tasks(_registry(), config)
    with tqdm(total=config.n, desc="envs build: composite tasks", unit="task") as bar:

        def counted():
            for t in tasks:
                bar.update()
                yield t

        written = write_tasks(counted(), args.out)
    print(f"wrote {written} {config.split} tasks to {args.out}")
    return 0


def cmd_check(args: argparse.Namespace) -> int:
    from tirl.envs.check import check_registry
    from tirl.envs.core import Environments
    from tirl.envs.registry import REGISTRY

    before = set(REGISTRY.names())  # the library's and installed plugins'
    for module in args.module or []:
        try:
            importlib.import_module(module)
        except ImportError as e:
            raise ConfigError(f"--module {module}: cannot import it ({e})") from None
    if args.module:  # only the environments the user's modules registered
        mine = [n for n in REGISTRY.names() if n not in before]
        if not mine:
            raise ConfigError(
                "the given modules registered no environment (use tirl.envs.core.atomic)"
            )
        registry = Environments()
        for n in mine:
            registry.add(REGISTRY.get(n))
    else:
        registry = _registry()
    faults = check_registry(registry, args.n)
    for lines in faults.values():
        for line in lines:
            print(line)
    print(f"checked {len(registry)} environments: {len(faults)} with faults", file=sys.stderr)
    return 1 if faults else 0


def add_envs_parser(sub) -> None:
    envs = sub.add_parser("envs", help="RACES environments: list, inspect, build datasets, check")
    envs_sub = envs.add_subparsers(dest="envs_command", required=True, metavar="COMMAND")
    envs.set_defaults(config=None, overrides=[])

    p = envs_sub.add_parser("list", help="list the registered environments")
    p.add_argument("--domain", help="only this domain")
    p.add_argument("--types", action="store_true", help="also print the type graph")
    p.set_defaults(func=cmd_list)

    for name, func, help_ in (
        ("show", cmd_show, "an environment's types, code rendering and one problem"),
        ("sample", cmd_sample, "problems and their answers from one environment"),
    ):
        p = envs_sub.add_parser(name, help=help_)
        p.add_argument("name", help="an environment name, e.g. lists.sort_ascending")
        p.add_argument("--seed", type=number(int, ">= 0"), default=0)
        p.add_argument("--level", type=int, default=1, choices=(1, 2, 3))
        if name == "sample":
            p.add_argument(
                "-n", type=number(int, "[1, 100000]"), default=3, help="how many (default 3)"
            )
        p.set_defaults(func=func)

    p = envs_sub.add_parser("build", help="write a dataset of composite tasks (JSONL or Parquet)")
    p.add_argument(
        "--out", type=output_file, required=True, help="output path; .parquet writes Parquet"
    )
    p.add_argument(
        "-n", type=number(int, ">= 1"), default=1000, help="number of tasks (default 1000)"
    )
    p.add_argument("--seed", type=number(int, ">= 0"), default=0)
    p.add_argument(
        "--split", default="train", choices=("train", "test"), help="train or test (default train)"
    )
    p.add_argument(
        "--mix", help="operator mixture, e.g. sequential=0.4,parallel=0.2,sort=0.2,select=0.2"
    )
    p.add_argument("--sizes", default="2-5", help="composition sizes in 1..12, e.g. 2-5 (default)")
    p.add_argument("--level", type=int, default=1, choices=(1, 2, 3), help="input difficulty")
    p.add_argument(
        "--inputs-per-composite",
        type=number(int, ">= 1"),
        default=1,
        help="tasks from one sequence of environments, each from another input (default 1)",
    )
    p.set_defaults(func=cmd_build)

    p = envs_sub.add_parser("check", help="run the oracle checks on the library or on your modules")
    p.add_argument(
        "--module", action="append", help="import this module and check only what it registers"
    )
    p.add_argument(
        "-n", type=number(int, ">= 1"), default=30, help="inputs per environment (default 30)"
    )
    p.set_defaults(func=cmd_check)
