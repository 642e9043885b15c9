"""`tirl eval MODEL` on the config's data.eval sets takes the road --benchmark takes: MODEL is the
config's model.name_or_path before the config is checked (a chat template is seen, the tiny
model's max_positions is not applied to a loaded model), -k / --temperature / --max-tokens set
what runs, and --out keeps every trajectory in a locked folder that is never a training run's.
Real `tirl` commands on real tiny saved models and a real tiny training run."""

from __future__ import annotations

import json
import shutil

import pytest
from tiny_run import TINY, start, tirl, wait_until_holder

from tirl.cli import main
from tirl.envs.arithmetic import ArithmeticEnv
from tirl.files import LOCK_NAME
from tirl.models.tiny import IM_START, TinyModelSpec, build_model, save_policy, train_tokenizer
from tirl.protocol import get_protocol
from tirl.synth.arithmetic import demonstration_texts
from tirl.tasks.prompts import default_system_prompt

ITEMS = 2
FAST = [f"data.eval=[{{name: heldout, items: {ITEMS}}}]", "eval.samples_per_item=0"]
CONTEXT = 256  # the saved model's own context, above the tiny model's default max_positions


@pytest.fixture(scope="module")
def chat_model(tmp_path_factory):
    """A saved tiny model whose tokenizer has a chat template, with a context of CONTEXT."""
    texts = [
        "".join(t for _, t in demonstration_texts(item, item.answer))
        for item in ArithmeticEnv().items("train", 100, start=10**6)
    ]
    texts += [default_system_prompt(get_protocol("cir_fences")), "system user assistant"] * 20
    tokenizer = train_tokenizer(texts, vocab_size=384, chat_template=True)
    spec = TinyModelSpec(hidden_size=32, layers=1, heads=2, max_positions=CONTEXT)
    folder = tmp_path_factory.mktemp("chat") / "model"
    save_policy(build_model(tokenizer, spec, seed=0), tokenizer, folder)
    return folder


@pytest.fixture(scope="module")
def train_run(tmp_path_factory):
    """A finished tiny `tirl train` run folder (SFT only)."""
    out = tmp_path_factory.mktemp("runs")
    overrides = [o for o in TINY if not o.startswith("rl.")] + ["rl.steps=0"]
    assert main(["train", f"out_dir={out}", "name=run", *overrides]) == 0
    return out / "run"


def _error(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tirl: error: "), err
    return err[0]


def _samples(folder) -> list[dict]:
    return [json.loads(line) for line in (folder / "samples" / "heldout.jsonl").open()]


def test_chat_true_is_accepted_with_the_model_alone_and_prompts_use_its_template(
    chat_model, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = ["eval", str(chat_model), "prompt.chat=true", *FAST, "--max-tokens", "4"]
    assert main([*argv, "--out", str(out)]) == 0, capsys.readouterr().err[-2000:]
    im_start = json.loads((chat_model / "tokenizer.json").read_text())["model"]["vocab"][IM_START]
    prompts = [s["segments"][0] for s in _samples(out)]
    assert len(prompts) == ITEMS
    assert all(p["kind"] == "prompt" and p["ids"][0] == im_start for p in prompts)


def test_an_override_naming_another_model_is_refused_the_same_one_is_not(
    chat_model, tmp_path, capsys
):
    other = tmp_path / "other"
    assert main(["eval", str(chat_model), *FAST, f"model.name_or_path={other}"]) == 2
    line = _error(capsys)
    assert "name different models" in line and str(other) in line and str(chat_model) in line
    same = f"model.name_or_path={chat_model}/."  # one folder, written another way
    assert main(["eval", str(chat_model), *FAST, same, "--max-tokens", "4"]) == 0


def test_the_tiny_models_max_positions_is_not_applied_to_a_loaded_model(
    chat_model, tmp_path, capsys
):
    # 200 > max_positions (192, the preset's): only the tiny model made from scratch has that
    assert main(["eval", str(chat_model), *FAST, "eval.max_model_tokens=200"]) == 0
    # past the model's own context: the engine stops each sequence at the context
    out = tmp_path / "out"
    assert main(["eval", str(chat_model), *FAST, "--max-tokens", "400", "--out", str(out)]) == 0
    lengths = [sum(len(s["ids"]) for s in t["segments"]) for t in _samples(out)]
    assert len(lengths) == ITEMS and max(lengths) <= CONTEXT


def test_the_flags_set_what_the_config_road_runs_and_out_keeps_every_trajectory(
    chat_model, tmp_path, capsys
):
    out = tmp_path / "out"
    argv = ["eval", str(chat_model), f"data.eval=[{{name: heldout, items: {ITEMS}}}]"]
    assert main([*argv, "--max-tokens", "3", "-k", "2", "--temperature", "0.5", "--out", str(out)]) == 0  # fmt: skip
    printed = json.loads(capsys.readouterr().out)  # the metrics, printed as before
    metrics = json.loads((out / "eval.json").read_text())["heldout"]
    assert printed["heldout"]["eval/k"] == metrics["eval/k"] == 2
    assert metrics["eval/temperature"] == 0.5 and metrics["length/model_tokens_mean"] <= 3
    assert "eval/avg@k" in metrics and metrics["eval/samples"] == ITEMS * (1 + 2)
    samples = _samples(out)  # the greedy pass and the sampled one, every trajectory
    assert sorted(s["meta"]["temperature"] for s in samples) == [0.0] * ITEMS + [0.5] * 2 * ITEMS
    assert all(sum(len(g["ids"]) for g in s["segments"][1:]) <= 3 for s in samples)
    assert all("score" in s and s["meta"]["eval_set"] == "heldout" for s in samples)
    assert "<html" in (out / "viewer.html").read_text() and (out / "report.md").is_file()
    # again on the same folder, greedy only: its files are written again
    assert main([*argv, "--temperature", "0", "--out", str(out)]) == 0
    metrics = json.loads((out / "eval.json").read_text())["heldout"]
    assert metrics["eval/samples"] == ITEMS and "eval/avg@k" not in metrics
    assert len(_samples(out)) == ITEMS


@pytest.mark.slow
def test_a_second_eval_on_an_out_folder_in_use_is_refused(chat_model, tmp_path, capsys):
    out = tmp_path / "out"
    long = ["data.eval=[{name: heldout, items: 2000}]", "eval.samples_per_item=4"]
    first = start(tirl("eval", str(chat_model), *long, "--out", str(out)), tmp_path / "log")
    try:
        wait_until_holder(out, first)
        assert main(["eval", str(chat_model), *FAST, "--out", str(out)]) == 2
        assert f"in use by pid {first.pid} " in _error(capsys)
    finally:
        first.kill()
        first.wait()


@pytest.mark.parametrize("where", [".", "eval", "code"])
def test_out_in_or_inside_a_training_run_folder_is_refused(where, train_run, tmp_path, capsys):
    report = (train_run / "report.md").read_bytes()
    bench = tmp_path / "b.jsonl"
    bench.write_text(json.dumps({"problem": "Compute 2 * 3.", "answer": "6"}) + "\n")
    out = train_run / where
    model = str(train_run / "code" / "sft")
    for road in (["--benchmark", str(bench)], FAST):
        assert main(["eval", model, *road, "--out", str(out)]) == 2
        line = _error(capsys)
        assert "`tirl train` folder" in line and str(train_run.resolve()) in line
        assert f"{train_run.name}-eval" in line  # a folder beside the run is suggested
    assert (train_run / "report.md").read_bytes() == report
    assert not (train_run / "eval").exists() and not (train_run / "metrics.json").exists()


def test_a_run_folder_of_a_tirl_before_locks_is_refused_too(train_run, tmp_path, capsys):
    old = tmp_path / "old_run"
    shutil.copytree(train_run, old)
    (old / LOCK_NAME).unlink()  # config.yaml and metrics.jsonl still say what it is
    assert main(["eval", str(old / "code" / "sft"), *FAST, "--out", str(old / "e")]) == 2
    assert "`tirl train` folder" in _error(capsys)


@pytest.mark.parametrize("chat", [True, False])
def test_the_benchmark_road_renders_prompts_as_training_does(chat, chat_model, tmp_path, capsys):
    """--benchmark with a chat model: the problem in the chat template with the protocol's
    system message (prompt.chat, as the config road and training); prompt.chat=false: the
    benchmark's plain text prompt."""
    from tirl.eval.benchmark_eval import MATH_PROMPT
    from tirl.models.tiny import load_policy

    bench = tmp_path / "sums.jsonl"
    bench.write_text(json.dumps({"problem": "Compute 2 + 3.", "answer": "5"}) + "\n")
    out = tmp_path / "out"
    argv = ["eval", str(chat_model), "--benchmark", str(bench), "--out", str(out),
            "--temperature", "0", "--max-tokens", "3", f"prompt.chat={str(chat).lower()}"]  # fmt: skip
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    (record,) = [json.loads(ln) for ln in (out / "sums.samples.jsonl").open()]
    prompt = record["trajectory"]["segments"][0]
    tokenizer = load_policy(chat_model)[1]
    if chat:
        assert prompt["text"].startswith(f"{IM_START}system\n")
        assert "Compute 2 + 3." in prompt["text"] and MATH_PROMPT[-20:] not in prompt["text"]
    else:
        want = MATH_PROMPT.format(problem="Compute 2 + 3.")
        assert prompt["ids"] == tokenizer(want, add_special_tokens=False)["input_ids"]
