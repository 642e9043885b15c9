"""One test template, run over every registered atomic environment (the reasoning-gym habit,
with the adversarial probes it lacks): `tirl.envs.check.check_environment` on 100 inputs per
environment, spread over its difficulty levels. It checks that inputs are valid and seeded, the
gold output verifies, near misses and truncated, stuffed, wrapped, wrong-type and empty answers
are rejected, and the code rendering reproduces the mapper on every one of the 100 inputs."""

from __future__ import annotations

import pytest

import tirl.envs.library  # noqa: F401  (registers the library)
from tirl.envs.check import check_environment
from tirl.envs.core import REGISTRY

ENVS = sorted(REGISTRY, key=lambda e: e.name)


def test_the_library_is_large_and_spans_domains():
    assert len(REGISTRY) >= 300, len(REGISTRY)
    assert len(REGISTRY.domains()) >= 10, REGISTRY.domains()


@pytest.mark.parametrize("env", ENVS, ids=lambda e: e.name)
def test_environment_passes_every_oracle_check(env):
    assert check_environment(env, n=100) == []


def test_one_seed_gives_10000_distinct_composites_of_size_2_to_5():
    from tirl.envs.search import SearchConfig, search, take

    paths = take(search(REGISTRY, seed=0, config=SearchConfig(min_size=2, max_size=5)), 10_000)
    assert len(paths) == 10_000
    assert len({p.names() for p in paths}) == 10_000
    assert all(2 <= p.size <= 5 for p in paths)
    assert len({p.envs[0].domain for p in paths}) >= 10  # not one corner of the type graph


def test_train_and_test_tasks_never_share_an_item_and_round_trip(tmp_path):
    from tirl.envs.dataset import BuildConfig, build_tasks, read_tasks, write_tasks
    from tirl.envs.operators import score

    train = list(build_tasks(REGISTRY, BuildConfig(n=200, seed=0, split="train")))
    test = list(build_tasks(REGISTRY, BuildConfig(n=200, seed=0, split="test")))
    assert len(train) == len(test) == 200
    key = lambda t: (t.envs, t.xs[0])  # noqa: E731
    assert not {key(t) for t in train} & {key(t) for t in test}
    assert {t.operator for t in train} == {"sequential", "parallel", "sort", "select"}
    for suffix in (".jsonl", ".parquet"):
        path = tmp_path / f"tasks{suffix}"
        assert write_tasks(train, path) == 200
        again = read_tasks(path)
        assert again == train
    assert all(score(t, t.answer, REGISTRY).value == 1.0 for t in train)


def test_envs_cli(tmp_path, capsys):
    from tirl.cli import main

    assert main(["envs", "list", "--domain", "lists"]) == 0
    assert "lists." in capsys.readouterr().out
    assert main(["envs", "show", "lists.nope"]) == 2
    assert "did you mean" in capsys.readouterr().err
    out = tmp_path / "tasks.jsonl"
    assert main(["envs", "build", "--out", str(out), "-n", "20", "--mix", "sort=1"]) == 0
    assert len(out.read_text().splitlines()) == 20
    assert main(["envs", "build", "--out", str(out), "--mix", "sideways=1"]) == 2
    assert "unknown operator 'sideways'" in capsys.readouterr().err
    assert main(["envs", "build", "--out", str(out), "--sizes", "5-2"]) == 2
    assert main(["envs", "build", "--out", str(out), "--inputs-per-composite", "0"]) == 2
    assert "--inputs-per-composite" in capsys.readouterr().err
    assert main(["envs", "check", "--module", "no_such_module_here"]) == 2


def test_the_environment_library_does_not_import_torch():
    import subprocess
    import sys

    code = (
        "import sys, tirl.envs.library, tirl.envs.search, tirl.envs.operators, tirl.envs.dataset,"
        " tirl.envs.check, tirl.envs.cli\nassert 'torch' not in sys.modules, 'torch was imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


def test_demonstration_code_prints_every_value_as_its_answer_is_written():
    import contextlib
    import io
    import random

    from tirl.envs.demos import PRELUDE, show

    rng = random.Random(0)
    for env in ENVS:
        for level in (1, 2, 3):
            x = env.sample(rng, level)
            for kind, value in ((env.input, x), (env.output, env.apply(x))):
                out = io.StringIO()
                with contextlib.redirect_stdout(out):
                    exec(PRELUDE + show(kind, "y7"), {"y7": value})  # noqa: S102
                assert out.getvalue() == kind.render(value) + "\n", (env.name, kind.name)
