"""`tirl train` as one pipeline driven by config: task sources mixed by weight, demonstrations
from a `tirl synth` file, several evaluation sets, an engine that must receive the trained
weights, and one-line errors for what a config gets wrong."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import tirl_serve
from tiny_run import TINY, error_lines, offline_env

from tirl.cli import main

# TINY without its eval sets (each test names its own).
SMALL = [o for o in TINY if not o.startswith("data.eval=")]


def write_dataset(path, n: int = 12) -> str:
    rows = [{"problem": f"Compute {a} + {a + 1}.", "answer": str(2 * a + 1)} for a in range(n)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def write_synth_file(path, protocol: str = "cir_fences") -> str:
    """Demonstrations as `tirl synth` writes them: steps with the interpreter's output."""
    records = []
    for a in (3, 4, 5):
        steps = [
            {"kind": "text", "text": "Add them.\n"},
            {"kind": "code", "text": f"print({a} + {a + 1})", "output": str(2 * a + 1)},
            {"kind": "text", "text": f"The answer is \\boxed{{{2 * a + 1}}}."},
        ]
        problem = f"Compute {a} + {a + 1}."
        records.append(
            {"problem": problem, "answer": str(2 * a + 1), "protocol": protocol, "steps": steps}
        )
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(path)


def test_a_two_source_mixture_trains_and_evaluates_every_eval_set(tmp_path, capsys):
    """Arithmetic and a dataset file mixed 2:1, SFT on a synth file (the dataset has no
    demonstrator), RL, and two eval sets evaluated after SFT, after RL and every RL step."""
    data = write_dataset(tmp_path / "sums.jsonl")
    demos = write_synth_file(tmp_path / "demos.jsonl")
    train = (
        "data.train=[{source: arithmetic, digits: 2, weight: 2},"
        f" {{source: dataset, path: '{data}', test_share: 0.5}}]"
    )
    sets = (
        "data.eval=[{name: heldout, items: 3},"
        " {name: products, items: 2, source: arithmetic, kinds: [product], digits: 2}]"
    )
    argv = ["train", f"out_dir={tmp_path}", "name=mix", *SMALL, train, sets]
    argv += [f"sft.data={demos}", "rl.steps=2", "eval.every_rl_steps=1"]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    run = tmp_path / "mix"
    results = json.loads((run / "eval.json").read_text())
    for phase in ("sft", "rl"):
        assert set(results["code"][phase]) == {"heldout", "products"}
        assert results["code"][phase]["products"]["eval/n_items"] == 2
        for name in ("heldout", "products"):
            assert (run / "samples" / f"code_{phase}_{name}.jsonl").is_file()
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    during = [r for r in records if r["phase"] == "rl_eval"]
    assert [r["step"] for r in during] == [1]  # every step, the last one aside (evaluated after)
    assert {"eval/heldout/accuracy", "eval/products/accuracy"} <= set(during[0])
    # the held-out set draws from both sources; its samples record their task's score
    heldout = [json.loads(line) for line in (run / "samples" / "code_rl_heldout.jsonl").open()]
    ids = {t["task_id"].split("/")[0] for t in heldout}
    assert ids == {"arithmetic", "dataset"}, ids
    assert all({"correct", "reward"} <= set(t["score"]) and "gold" in t["meta"] for t in heldout)
    assert "products" in capsys.readouterr().out  # the summary table names each set


def test_rl_with_an_engine_that_cannot_receive_weights_fails_at_start(tmp_path):
    """An OpenAI-compatible server keeps the weights it was started with: RL on it would learn
    from a stale policy, so the run is refused before anything is made."""
    cmd = [sys.executable, "-m", "tirl.cli", "train", f"out_dir={tmp_path}", "name=stale"]
    cmd += ["rollout.engine=openai", "rollout.urls=[http://127.0.0.1:9]", "rl.steps=3"]
    proc = subprocess.run(cmd, env=offline_env(), capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    (line,) = error_lines(proc.stderr)
    assert "rollout.engine openai cannot receive the trained weights" in line
    assert not (tmp_path / "stale").exists()


def _bad_entry(tmp_path) -> dict[str, tuple[str, list[str]]]:
    data = write_dataset(tmp_path / "rows.jsonl")
    return {
        "unknown source": (
            "data.train=[{source: nope}]",
            ["data.train[0].source", "unknown task source 'nope'", "arithmetic"],
        ),
        "weight 0": (
            "data.train=[{source: arithmetic, weight: 0}]",
            ["data.train[0].weight", "> 0"],
        ),
        "empty": ("data.train=[]", ["data.train", "at least one task source"]),
        "bad key": (
            "data.train=[{source: arithmetic, digitz: 2}]",
            ["data.train[0].digitz"],
        ),
        "no demonstrator": (
            f"data.train=[{{source: dataset, path: '{data}'}}]",
            ["data.train[0] (dataset) has no built-in demonstrations", "sft.data", "sft.steps: 0"],
        ),
        "bad eval set": ("data.eval=[{name: a/b, items: 3}]", ["data.eval[0]", "plain name"]),
    }


@pytest.mark.parametrize(
    "case", ["unknown source", "weight 0", "empty", "bad key", "no demonstrator", "bad eval set"]
)
def test_bad_task_configs_are_one_line_errors_before_anything_runs(case, tmp_path, capsys):
    override, words = _bad_entry(tmp_path)[case]
    assert main(["train", f"out_dir={tmp_path}", "name=bad", override]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("tirl: error:"), err
    for word in words:
        assert word in lines[0], lines[0]
    assert f"override {override!r}"[:30] in lines[0]  # it names the override that set it
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize(
    "options, words",
    [
        ("{threads: -1}", "engine_options.threads is an integer >= 0 (0: the run's threads)"),
        ("{kv_cache: paged}", "engine_options.kv_cache is one of auto, slots, padded"),
        ("{fused: 1}", "engine_options.fused is true, false or null"),
    ],
)
def test_bad_hf_engine_options_are_one_line_errors_naming_the_override(
    options, words, tmp_path, capsys
):
    override = f"rollout.engine_options={options}"
    assert main(["train", f"out_dir={tmp_path}", "name=bad", override]) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"tirl: error: override {override!r}"), lines
    assert words in lines[0], lines[0]
    assert not (tmp_path / "bad").exists()


def test_a_bad_entry_in_a_subprocess_prints_no_traceback(tmp_path):
    cmd = [sys.executable, "-m", "tirl.cli", "train", f"out_dir={tmp_path}", "name=bad"]
    proc = subprocess.run(
        [*cmd, "data.train=[{source: arithmetic, weight: -1}]"],
        env=offline_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert len(error_lines(proc.stderr)) == 1


def test_a_list_item_is_overridden_by_position(tmp_path, capsys):
    """`data.train[0].digits=2` changes the preset's first source; a position the list does
    not have is a one-line error."""
    assert main(["config", "data.train[0].digits=2"]) == 0
    assert "digits: 2" in capsys.readouterr().out
    assert main(["config", "data.train[3].digits=2"]) == 2
    assert "data.train" in capsys.readouterr().err


def test_config_keys_list_the_data_sections_and_every_source(capsys):
    assert main(["config", "--keys"]) == 0
    out = capsys.readouterr().out
    for key in ("data.train", "data.eval", "prompt.chat", "rollout.engine", "model.dtype"):
        assert key in out, key
    for source in ("source: arithmetic", "source: dataset", "source: races"):
        assert source in out, source
    assert main(["config", "--help-fields"]) == 0
    assert capsys.readouterr().out == out


def test_the_quickstart_preset_is_a_train_config():
    """`tirl quickstart` is `tirl train` with the bundled preset; the preset holds the
    quickstart's settings and loads cleanly."""
    from tirl.cli.common import load_run_config, preset_path

    assert preset_path("quickstart").is_file()
    cfg = load_run_config(None, [])
    assert cfg.name == "quickstart" and cfg.variants == ["code", "text"]
    assert cfg.data.train == [
        {"source": "arithmetic", "kinds": ["product", "mod", "chain"], "digits": 3}
    ]
    assert cfg.data.eval == [{"name": "heldout", "items": 200}]
    assert (cfg.sft.steps, cfg.sft.examples, cfg.rl.steps, cfg.rl.advantage) == (
        800,
        4000,
        45,
        "grpo",
    )


def test_an_evaluation_only_run_samples_from_an_openai_compatible_server(
    tiny_model, tokenizer, tmp_path
):
    """rl.steps 0 and sft.steps 0: the pipeline evaluates the served model (`tirl serve` of a
    real tiny model, over loopback) with its own tokenizer, through the OpenAI engine."""
    folder = tmp_path / "model"
    argv = ["train", f"out_dir={tmp_path}", "name=served", "variants=[code]"]
    argv += [f"model.name_or_path={folder}", "sft.steps=0", "rl.steps=0"]
    argv += ["data.eval=[{name: heldout, items: 2}]", "eval.samples_per_item=0"]
    with tirl_serve(tiny_model, tokenizer, folder) as url:
        argv += ["rollout.engine=openai", f"rollout.urls=[{url}]", "eval.max_model_tokens=16"]
        assert main(argv) == 0
    results = json.loads((tmp_path / "served" / "eval.json").read_text())
    metrics = results["code"]["sft"]["heldout"]
    assert metrics["eval/samples"] == 2 and metrics["eval/failed"] == 0
    assert not (tmp_path / "served" / "code" / "sft").exists()  # nothing was trained or saved


RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def test_sft_from_a_synth_races_file_then_rl_in_one_config(tmp_path, capsys):
    """`tirl synth races` writes teacher-free trajectories; `recipes/synth_races.yaml` (shrunk)
    fine-tunes on them, trains RL on the races source with the operators' rewards and evaluates
    on the held-out RACES split. The same file under the other protocol is refused at load."""
    synth = tmp_path / "synth"
    assert main(["synth", "races", "--out", str(synth), "-n", "6", "--sizes", "1-2"]) == 0
    demos = synth / "trajectories.jsonl"
    n_demos = sum(1 for _ in demos.open())
    assert n_demos >= 3
    recipe = str(RECIPES / "synth_races.yaml")
    small = [f"out_dir={tmp_path}", f"sft.data={demos}", "sft.steps=3", "sft.batch_size=4"]
    small += ["rl.steps=1", "rl.prompts_per_step=2", "rl.group_size=2", "rl.max_model_tokens=16"]
    small += ["data.eval=[{name: races_heldout, items: 2}]", "eval.max_model_tokens=16"]
    small += ["model.hidden_size=32", "model.layers=1", "model.heads=2"]
    small += ["model.vocab_size=300", "model.tokenizer_corpus_items=4"]
    assert main(["train", recipe, *small]) == 0, capsys.readouterr().err[-2000:]
    run = tmp_path / "synth_races"
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in records if r["phase"] == "sft"] == [0, 1, 2]
    assert [r["step"] for r in records if r["phase"] == "rl"] == [0]
    results = json.loads((run / "eval.json").read_text())
    assert set(results["code"]) == {"sft", "rl"}
    samples = [
        json.loads(line) for line in (run / "samples" / "code_rl_races_heldout.jsonl").open()
    ]
    assert all(s["task_id"].startswith("races/test/") for s in samples)
    capsys.readouterr()
    # the synth file is in agentmath_tags: a run in cir_fences refuses it, naming line 1
    assert main(["train", recipe, *small, "name=other", "protocol=cir_fences"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"{demos}:1" in line and "agentmath_tags" in line and "cir_fences" in line, line


@pytest.mark.parametrize("recipe", sorted(p.name for p in RECIPES.glob("*.yaml")))
def test_every_recipe_loads_once_its_placeholder_paths_are_set(recipe, tmp_path, capsys):
    """`tirl config RECIPE` validates each shipped recipe (sources built, files read); the
    placeholders of the data paths are pointed at real files first."""
    path = RECIPES / recipe
    text = path.read_text()
    if "source: verifiers" in text and importlib.util.find_spec("verifiers") is None:
        pytest.skip("verifiers is not installed here: tests/verifiers_side loads this recipe")
    overrides = []
    if "path: problems.jsonl" in text:
        overrides.append(f"data.train[0].path={write_dataset(tmp_path / 'rows.jsonl')}")
    if "sft:" in text and "  data: runs/" in text:
        protocol = "agentmath_tags" if "protocol: agentmath_tags" in text else "cir_fences"
        overrides.append(f"sft.data={write_synth_file(tmp_path / 'demos.jsonl', protocol)}")
    assert main(["config", str(path), *overrides]) == 0, capsys.readouterr().err


def test_eval_base_evaluates_the_loaded_model_before_sft_and_pairs_every_phase(tmp_path, capsys):
    argv = ["train", f"out_dir={tmp_path}", "name=base", *SMALL, "variants=[code, text]",
            "data.eval=[{name: heldout, items: 3}]", "eval.base=true", "rl.steps=1"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    out = capsys.readouterr().out
    run = tmp_path / "base"
    results = json.loads((run / "eval.json").read_text())
    for variant in ("code", "text"):
        assert list(results[variant]) == ["base", "sft", "rl"]
        assert (run / "samples" / f"{variant}_base_heldout.jsonl").is_file()
    assert "code: base → SFT heldout (3 items)" in out and "text → code (RL)" in out
    assert "## Paired comparisons" in (run / "report.md").read_text()


def test_quickstart_with_a_model_takes_the_real_model_preset(tmp_path, capsys):
    """`tirl quickstart --model NAME` is the bundled real-model preset with that model: a
    near miss of a shipped name is refused before anything runs, naming the right one."""
    from tirl.cli.common import load_run_config, preset_path

    cfg = load_run_config(str(preset_path("real_model")), [])
    assert cfg.model.name_or_path == "smollm2-135m-instruct" and cfg.model.lora.rank > 0
    assert cfg.prompt.chat and cfg.eval.base and cfg.variants == ["code", "text"]
    code = main(["quickstart", "--model", "smollm2-135m", f"out_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert code == 2 and "did you mean 'smollm2-135m-instruct'" in err
    assert not any(tmp_path.iterdir())
