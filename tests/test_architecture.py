"""The import direction of docs/architecture.md ("Layers"), checked on the source: every
`import` in src/tirl (at any level, inside functions too) goes down the layer table, never
sideways between the pipelines (`train`, `eval`, `synth`), never up, and never into
`tirl.cli`. Imports of any depth form no cycle, neither between modules (two modules of one
package included) nor between packages. An import under `if TYPE_CHECKING:` is left out of the
module cycle check (it never runs: it only names a type for the annotations, as `SlotRows`
names the fused pass it is handed); the layer and package checks still count it.

Every import counts, with no exemption: an `importlib.import_module("tirl.x")` or
`__import__("tirl.x")` of a constant name is an import edge like the statement. A registry whose
entries are files of their own is therefore three modules with the dependency running one way
(`tirl.registry`'s docstring): the code that reads it imports the built-in entries, which
import the small module holding the registry and its decorator.

The check reads the files with `ast`; nothing is imported, so a violation is reported even in a
module that cannot be imported on this machine, as `file:line: a -> b (not allowed: ...)`.
"""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

SRC = Path(__file__).resolve().parents[1] / "src"
ROOT = SRC / "tirl"

# Imports that break the table today and are being removed in issue 15; this set must end
# empty. Each entry is (importing module, imported package): a new violation, even from the
# same module to another package, fails the test.
KNOWN_VIOLATIONS: set[tuple[str, str]] = set()

# The bottom layer: helpers any package may import.
BASE = {
    "tirl",
    "tirl.config",
    "tirl.files",
    "tirl.cliargs",
    "tirl.httpauth",
    "tirl.lifetime",
    "tirl.models",
    "tirl.registry",
    "tirl.cpu",
    "tirl.errors",
    "tirl.plugins",
    "tirl.report_kit",
}
# Modules that count as the command line (nothing may import them).
CLI_MODULES = {"tirl.cli"}

BELOW_PIPELINES = {
    "sandbox",
    "protocol",
    "algos",
    "envs",
    "backends",
    "rollout",
    "rewards",
    "tasks",
    "tools",
}
PIPELINES = {"train", "eval", "synth"}
PACKAGES = BELOW_PIPELINES | {"run"} | PIPELINES | {"apps", "studies", "integrations", "cli"}

# package -> the other packages it may import (docs/architecture.md, "Layers").
ALLOWED: dict[str, set[str]] = {
    "sandbox": {"protocol"},
    "protocol": set(),
    "algos": {"protocol"},
    "envs": {"protocol"},
    "backends": {"protocol"},
    "tools": {"protocol", "sandbox"},
    "rollout": {"backends", "protocol", "sandbox", "tools"},
    "rewards": {"protocol", "envs"},
    # tasks -> sandbox: demonstrations run their code and show its output through the one
    # formatter (architecture.md invariant 4); sandbox imports nothing above it, so no cycle.
    "tasks": {"envs", "rewards", "protocol", "sandbox", "tools"},
    # the run layer: a run's config and the builders every pipeline samples with
    "run": set(BELOW_PIPELINES),
    "train": BELOW_PIPELINES | {"run"},
    "eval": BELOW_PIPELINES | {"run"},
    "synth": BELOW_PIPELINES | {"run"},
    "apps": BELOW_PIPELINES | {"run"} | PIPELINES,
    "studies": BELOW_PIPELINES | {"run"} | PIPELINES,
    "integrations": PACKAGES - {"cli", "integrations", "apps", "studies"},
    "cli": PACKAGES - {"cli"},
}
# Nothing imports these, except that the command line wires each integration's subcommands
# (`tirl verl ...`), and calls the runs that join the pipelines (`tirl eval`) and the studies
# (`tirl ablate`, `tirl study ...`).
NEVER_IMPORTED = {"cli", "integrations", "apps", "studies"}
IMPORTED_ONLY_BY = {"integrations": {"cli"}, "apps": {"cli"}, "studies": {"cli"}}


def module_name(path: Path) -> str:
    parts = list(path.relative_to(SRC).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def package_of(module: str) -> str:
    """The layer a module belongs to: one of PACKAGES, or "base"."""
    if module in CLI_MODULES or module.startswith(tuple(m + "." for m in CLI_MODULES)):
        return "cli"
    top = ".".join(module.split(".")[:2])
    if module in BASE or top in BASE:
        return "base"
    name = module.split(".")[1]
    if name not in PACKAGES:
        raise AssertionError(f"{module}: not in any package of the layer table; add it there")
    return name


MODULES = {module_name(p): p for p in sorted(ROOT.rglob("*.py"))}


@dataclass(frozen=True)
class Import:
    source: str  # the importing module
    target: str  # the module imported (a submodule when `from pkg import submodule`)
    line: int
    top_level: bool  # runs when the module is imported (not in a function or TYPE_CHECKING)
    type_checking: bool = False  # under `if TYPE_CHECKING:`: never runs

    def where(self) -> str:
        return f"{MODULES[self.source].relative_to(SRC.parent)}:{self.line}"


def _is_type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imported_name(call: ast.Call) -> str | None:
    """The module a call imports by a constant name (`importlib.import_module("tirl.x")`,
    `import_module(...)`, `__import__(...)`), or None."""
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
    if name not in ("import_module", "__import__") or not call.args:
        return None
    arg = call.args[0]
    return arg.value if isinstance(arg, ast.Constant) and isinstance(arg.value, str) else None


def _resolve(source: str, node: ast.ImportFrom) -> str:
    if not node.level:
        return node.module or ""
    package = source if MODULES[source].name == "__init__.py" else source.rpartition(".")[0]
    base = package.split(".")
    base = base[: len(base) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def imports_of(source: str, text: str | None = None) -> list[Import]:
    """Every import of a tirl module in module `source` (its file, or `text`), with whether it
    runs at import time."""
    tree = ast.parse(MODULES[source].read_text(encoding="utf-8") if text is None else text)
    found: list[Import] = []

    def visit(node: ast.AST, top: bool, typing: bool) -> None:
        for child in ast.iter_child_nodes(node):
            child_top, child_typing = top, typing
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
                child_top = False
            elif isinstance(child, ast.If) and _is_type_checking(child):
                child_top, child_typing = False, True
            if isinstance(child, ast.Call) and _imported_name(child) is not None:
                found.append(Import(source, _imported_name(child), child.lineno, top, typing))
            if isinstance(child, ast.Import):
                for alias in child.names:
                    found.append(Import(source, alias.name, child.lineno, top, typing))
            elif isinstance(child, ast.ImportFrom):
                module = _resolve(source, child)
                for alias in child.names:
                    sub = f"{module}.{alias.name}"
                    target = sub if sub in MODULES else module
                    found.append(Import(source, target, child.lineno, top, typing))
            if isinstance(child, ast.If) and _is_type_checking(child):
                for branch in child.orelse:  # the `else:` of TYPE_CHECKING runs
                    visit(ast.Module(body=[branch], type_ignores=[]), top, typing)
                for branch in child.body:
                    visit(ast.Module(body=[branch], type_ignores=[]), child_top, child_typing)
                continue
            visit(child, child_top, child_typing)

    visit(tree, True, False)
    return [i for i in found if i.target == "tirl" or i.target.startswith("tirl.")]


ALL_IMPORTS = [imp for source in MODULES for imp in imports_of(source)]


def _why(source_pkg: str, target_pkg: str) -> str:
    if target_pkg in NEVER_IMPORTED:
        return f"nothing imports {target_pkg}"
    allowed = sorted(ALLOWED[source_pkg])
    return f"{source_pkg} may import only base and {', '.join(allowed) or 'nothing else'}"


def direction_violations() -> tuple[list[str], set[tuple[str, str]]]:
    """(messages of new violations, the known violations actually seen)."""
    messages, seen_known = [], set()
    for imp in ALL_IMPORTS:
        a, b = package_of(imp.source), package_of(imp.target)
        allowed = b in ALLOWED.get(a, set())
        if b in NEVER_IMPORTED:
            allowed = allowed and a in IMPORTED_ONLY_BY.get(b, set())
        if b == "base" or a == b or allowed:
            continue
        if (imp.source, b) in KNOWN_VIOLATIONS:
            seen_known.add((imp.source, b))
            continue
        message = f"{imp.where()}: {imp.source} -> {imp.target} (not allowed: {_why(a, b)})"
        if message not in messages:  # `from x import a, b` is one import
            messages.append(message)
    return messages, seen_known


def test_every_module_is_in_a_layer():
    assert len(MODULES) > 50  # the walk found the package
    for module in MODULES:
        package_of(module)  # raises for a module outside the table


def test_imports_follow_the_layer_table():
    messages, _ = direction_violations()
    assert not messages, "imports against docs/architecture.md's layers:\n" + "\n".join(messages)


def test_known_violations_are_still_there():
    """A violation removed from the code must be removed from KNOWN_VIOLATIONS too, so the set
    shrinks to empty instead of hiding a later regression."""
    _, seen = direction_violations()
    assert KNOWN_VIOLATIONS - seen == set(), "fixed; delete from KNOWN_VIOLATIONS"


def test_nothing_imports_the_command_line():
    bad = [
        f"{imp.where()}: {imp.source} -> {imp.target} (not allowed: nothing imports tirl.cli)"
        for imp in ALL_IMPORTS
        if package_of(imp.target) == "cli"
        and package_of(imp.source) != "cli"
        and (imp.source, "cli") not in KNOWN_VIOLATIONS
    ]
    assert not bad, "\n".join(bad)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one node (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    components: list[list[str]] = []

    def connect(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        on_stack.add(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                connect(w)
                low[v] = min(low[v], low[w])
            elif w in on_stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                on_stack.discard(w)
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                components.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            connect(v)
    return components


def _cycle_report(graph: dict[str, set[str]], edges: dict[tuple[str, str], list[str]]) -> str:
    lines = []
    for component in _cycles(graph):
        members = set(component)
        lines.append("cycle among " + ", ".join(component) + ":")
        for (a, b), places in sorted(edges.items()):
            if a in members and b in members:
                lines += [f"  {place}: {a} -> {b}" for place in places]
    return "\n".join(lines)


def _a_cycle(graph: dict[str, set[str]], component: list[str]) -> list[str]:
    """A shortest cycle through the first node of a strongly connected component, as the path
    [a, b, ..., a] (breadth-first inside the component)."""
    members, start = set(component), component[0]
    came_from: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(came_from[path[-1]])
                    return [start, *reversed(path[:-1]), start]
                if w in members and w not in came_from:
                    came_from[w] = v
                    nxt.append(w)
        frontier = nxt
    raise AssertionError(f"{component} is not a strongly connected component")


def module_cycles(imports: list[Import]) -> str:
    """The module import cycles among `imports` (TYPE_CHECKING ones left out, every other depth
    counted), one block per cycle: the path, then `file:line: a -> b (import-time | in a
    function)` for each edge on it. Empty when there is none."""
    graph: dict[str, set[str]] = {}
    edges: dict[tuple[str, str], list[str]] = {}
    for imp in imports:
        if imp.type_checking or imp.target == imp.source or imp.target not in MODULES:
            continue
        graph.setdefault(imp.source, set()).add(imp.target)
        when = "import-time" if imp.top_level else "in a function"
        edges.setdefault((imp.source, imp.target), []).append(f"{imp.where()} ({when})")
    blocks = []
    for component in _cycles(graph):
        path = _a_cycle(graph, component)
        lines = ["cycle: " + " -> ".join(path)]
        for a, b in zip(path, path[1:]):
            lines += [f"  {place}: {a} -> {b}" for place in edges[(a, b)]]
        if len(component) > len(path) - 1:
            lines.append("  (and more modules in the same knot: " + ", ".join(component) + ")")
        blocks.append("\n".join(lines))
    return "\n".join(blocks)


def test_no_import_cycle_between_modules_at_any_depth():
    """Two modules that import each other, even lazily inside a function, are one module cut in
    two: what both need moves to the lower one (or to a third module below both). Two modules
    of one package count the same as two of different packages."""
    report = module_cycles(ALL_IMPORTS)
    assert not report, (
        "import cycles between modules (docs/architecture.md, Layers; move what both sides"
        " need into the lower module instead of importing it lazily):\n" + report
    )


def test_the_cycle_check_names_each_edge_with_its_file_and_line():
    """A lazy import back into a module that imports it at the top is a cycle, reported with
    both places; the same import under TYPE_CHECKING is not."""
    down = Import("tirl.train.distributed", "tirl.train.update", 10, True)
    back = Import("tirl.train.update", "tirl.train.distributed", 20, False)
    report = module_cycles([down, back])
    assert report.splitlines() == [
        "cycle: tirl.train.distributed -> tirl.train.update -> tirl.train.distributed",
        "  src/tirl/train/distributed.py:10 (import-time): tirl.train.distributed -> tirl.train.update",
        "  src/tirl/train/update.py:20 (in a function): tirl.train.update -> tirl.train.distributed",
    ]
    typing_only = Import("tirl.train.update", "tirl.train.distributed", 20, False, True)
    assert module_cycles([down, typing_only]) == ""
    assert _a_cycle({"a": {"b"}, "b": {"c"}, "c": {"a", "b"}}, ["a", "b", "c"]) == [
        "a",
        "b",
        "c",
        "a",
    ]


def test_no_import_cycle_between_packages():
    graph: dict[str, set[str]] = {}
    edges: dict[tuple[str, str], list[str]] = {}
    for imp in ALL_IMPORTS:
        a, b = package_of(imp.source), package_of(imp.target)
        if a == b or "base" in (a, b) or (imp.source, b) in KNOWN_VIOLATIONS:
            continue
        graph.setdefault(a, set()).add(b)
        edges.setdefault((a, b), []).append(f"{imp.where()} ({imp.source} -> {imp.target})")
    report = _cycle_report(graph, edges)
    assert not report, report


def test_the_checker_sees_imports_inside_functions_and_relative_ones():
    """The walk is what every other test here rests on: a lazy import in a function body, a
    relative import and an import by a constant name (`importlib.import_module`) must all be
    found, and a TYPE_CHECKING import must not count as run."""
    text = (
        "from typing import TYPE_CHECKING\n"
        "import tirl.config\n"
        "from . import stages\n"
        "from ..eval import metrics\n"
        "if TYPE_CHECKING:\n    from tirl.run.config import RLConfig\n"
        "def f():\n    from tirl.cli import main\n"
        "try:\n    import tirl.rollout.router as r\nexcept ImportError:\n    pass\n"
        "def g(name):\n    importlib.import_module('tirl.tasks.sources')\n"
        "    importlib.import_module(name)\n"  # a name known only when it runs: not an edge
        "TOOLS = __import__('tirl.tools.builtins')\n"
    )
    found = [(i.target, i.line, i.top_level) for i in imports_of("tirl.synth.pipeline", text)]
    assert found == [
        ("tirl.config", 2, True),
        ("tirl.synth.stages", 3, True),
        ("tirl.eval.metrics", 4, True),
        ("tirl.run.config", 6, False),
        ("tirl.cli", 8, False),
        ("tirl.rollout.router", 10, True),
        ("tirl.tasks.sources", 14, False),
        ("tirl.tools.builtins", 16, True),
    ]
    typing = [i.target for i in imports_of("tirl.synth.pipeline", text) if i.type_checking]
    assert typing == ["tirl.run.config"]
    assert _cycles({"a": {"b"}, "b": {"a"}, "c": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []


def test_http_clients_of_a_generation_server_do_not_import_torch():
    """The engine interface lives in `tirl.backends.engine`, so a rollout over vLLM / SGLang
    servers (the OpenAI client behind the router) runs on a machine without torch."""
    code = (
        "import sys\nimport tirl.backends.engine, tirl.backends.openai, tirl.rollout.router\n"
        "assert 'torch' not in sys.modules, 'torch was imported'\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC)},
    )
    assert done.returncode == 0, done.stderr


def test_backends_hold_engines_only():
    """`tirl.backends` is the bottom floor's engines; an HTTP server (`tirl serve`'s app) lives
    with the apps that run it, so no backend module serves HTTP (aiohttp's `web`)."""
    serving = [
        f"{module}:{node.lineno}"
        for module, path in MODULES.items()
        if module.startswith("tirl.backends.")
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if isinstance(node, ast.ImportFrom)
        and node.module == "aiohttp"
        and any(alias.name == "web" for alias in node.names)
        or isinstance(node, ast.Import)
        and any(alias.name == "aiohttp.web" for alias in node.names)
    ]
    assert not serving, f"a backend serves HTTP: {serving}"
    assert "tirl.apps.server" in MODULES


def test_a_registrys_readers_hold_its_built_ins_and_the_task_interface_stays_light():
    """The readers of the three registries whose entries are files (task sources, tools,
    sandbox transports) import those files, so a fresh process finds the built-in entries
    through them without loading anything by name; `tirl.tasks` (the task interface) does not
    import the sources, and the sources import no heavy package until one is made."""
    code = (
        "import sys\nimport tirl.tasks\n"
        "assert 'tirl.tasks.sources' not in sys.modules, 'tirl.tasks imported the sources'\n"
        "from tirl.sandbox.config import SANDBOX_TRANSPORTS\n"
        "from tirl.tasks.registry import SOURCES\nfrom tirl.tools import TOOLS\n"
        "assert {'arithmetic', 'races', 'dataset', 'benchmark'} <= set(SOURCES), list(SOURCES)\n"
        "assert {'python', 'shell'} <= set(TOOLS), list(TOOLS)\n"
        "assert {'local', 'http', 'ray'} <= set(SANDBOX_TRANSPORTS), list(SANDBOX_TRANSPORTS)\n"
        "heavy = ('torch', 'reasoning_gym', 'verifiers', 'datasets', 'ray', 'aiohttp')\n"
        "assert not [m for m in heavy if m in sys.modules], [m for m in heavy if m in sys.modules]\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "PYTHONPATH": str(SRC), "TIRL_PLUGINS_AUTOLOAD": "0"},
    )
    assert done.returncode == 0, done.stderr


# What is built in one place only (architecture.md, "Scale"): the class -> the modules that may
# construct it. Everything else asks the builder (`tirl.run.build`, the engine and sandbox
# transport registries), so a run, an evaluation and a server cannot drift apart.
BUILT_IN_ONE_PLACE: dict[str, dict[str, str]] = {
    "RolloutSettings": {"tirl.run.build": "phase_settings"},
    "Sandbox": {
        "tirl.sandbox.transports": "the local transport",
        "tirl.sandbox.ray_pool": "the Ray transport's actor runs a local sandbox on its node",
    },
    "HTTPSandbox": {"tirl.sandbox.transports": "the http transport"},
    "RaySandboxPool": {"tirl.sandbox.transports": "the ray transport"},
    "HFEngine": {"tirl.rollout.engines": "the hf engine"},
    "OpenAIEngine": {"tirl.rollout.engines": "the openai engine"},
    "Router": {"tirl.rollout.engines": "the openai engine over several servers"},
    "VLLMEngine": {"tirl.rollout.engines": "the vllm engine"},
    # verl's server manager is handed to the agent loop per request by verl itself; the
    # registry's EngineSpec (config in, engine out) cannot make it.
    "VerlServerEngine": {"tirl.integrations.verl.agent_loop": "verl's per-request engine"},
}


def test_settings_sandboxes_and_engines_are_each_built_in_one_place():
    built: dict[str, set[str]] = {}
    for module, path in MODULES.items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Call):
                f = node.func
                name = f.id if isinstance(f, ast.Name) else getattr(f, "attr", None)
                if name in BUILT_IN_ONE_PLACE:
                    built.setdefault(name, set()).add(f"{module}:{node.lineno}")
    stray = [
        where
        for name, places in built.items()
        for where in places
        if where.split(":")[0] not in BUILT_IN_ONE_PLACE[name]
    ]
    assert not stray, f"built outside their one builder: {sorted(stray)}"
    assert set(built) == set(BUILT_IN_ONE_PLACE), "a class here is no longer built at all"
