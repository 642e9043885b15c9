"""reasoning-gym both ways, against the installed package (reasoning-gym 0.1.25).

Export (`tirl.integrations.reasoning_gym`): `reasoning_gym.create_dataset("tirl_races", ...)`
and friends give tirl's tasks, and `score_answer` on an extracted answer is exactly the reward
tirl's own scorer gives the model text it came from, for every RACES operator (right, wrong and
partially right answers) and for arithmetic; seeds behave (same seed, same items; seeds one
apart are not one stream shifted by one, as reasoning-gym's own are).

Import (`tirl.tasks.sources.reasoning_gym`): reasoning-gym datasets as a task source scored by
their own `score_answer`, splits apart, bad input one line each, and `tirl train` / `tirl eval`
on the recipe end to end.
"""

from __future__ import annotations

import json
import pickle
import re
import subprocess
import sys
from pathlib import Path

import pytest
import reasoning_gym
from reasoning_gym.coaching.experiment import Experiment
from reasoning_gym.composite import CompositeConfig, CompositeDataset, DatasetSpec
from reasoning_gym.factory import create_curriculum
from reasoning_gym.utils import extract_answer
from reasoning_gym.version_manager import DatasetVersionManager

import tirl.integrations.reasoning_gym  # noqa: F401  (registers the tirl_* datasets)
import tirl.tasks.sources.reasoning_gym  # noqa: F401  (registers the source; see the report)
from tirl.cli import main
from tirl.config import ConfigError
from tirl.envs.operators import OPERATORS
from tirl.tasks import make_source
from tirl.tasks.sources.reasoning_gym import ANSWER_REQUEST, score_entry

RECIPE = Path(__file__).resolve().parents[1] / "recipes" / "reasoning_gym.yaml"
IMPORTED = ("leg_counting", "basic_arithmetic", "spell_backward")
RACES_KEYS = {"min_size": 2, "max_size": 3}  # short chains keep the search fast


def prose(answer: str) -> str:
    """Model text around a final answer: a draft block first (the last block counts)."""
    return f"Let me think. <answer>draft</answer>\nChecking again.\n<answer>\n{answer}\n</answer>"


def scored_both_ways(data, entry, task, model_text: str) -> tuple[float, float]:
    """(reasoning-gym's score of the answer it extracts, tirl's reward of the whole text)."""
    return data.score_answer(extract_answer(model_text), entry), task.score(model_text).reward


# ------------------------------------------------------------------------------ export: RACES


def races_answers(operator: str, reference: str) -> list[str]:
    """Answers to score, from the reference (extracted form): right, wrong and partly right."""
    if operator in ("sequential", "parallel"):
        lines = reference.splitlines()
        unreadable = [re.sub(r":.*$", ": ???", line) for line in lines]
        return [
            reference,
            "\n".join(reversed(lines)),  # labelled lines in another order: still right
            "\n".join(unreadable),
            "\n".join(lines[:1] + unreadable[1:]),  # first right only: partial credit
            "\n".join(unreadable[:1] + lines[1:]),  # all but the first: PARALLEL's partial
            "\n".join(lines[:-1]),  # the last line missing
            "\n".join(lines + lines[:1]),  # a line given twice
            "",
        ]
    letters = [p.strip() for p in reference.split(",")]
    return [
        reference,
        ", ".join(reversed(letters)),
        letters[0],
        ", ".join(letters + letters[:1]),
        "Z",
        reference.lower(),
        "",
    ]


@pytest.mark.parametrize("operator", OPERATORS)
def test_races_scores_the_same_through_reasoning_gym_and_tirl(operator):
    data = reasoning_gym.create_dataset(
        "tirl_races", seed=7, size=6, mixture={operator: 1.0}, **RACES_KEYS
    )
    source = make_source({"source": "races", "mixture": {operator: 1.0}, **RACES_KEYS}, seed=7)
    rewards = set()
    for i, entry in enumerate(data):
        task = source.item("train", i)
        assert entry["question"] == task.problem
        assert entry["metadata"]["task_id"] == task.id
        assert entry["metadata"]["races_task"]["operator"] == operator
        assert data.score_answer(entry["answer"], entry) == 1.0  # the oracle round trip
        for answer in races_answers(operator, entry["answer"]):
            text = prose(answer)
            via_rg, via_tirl = scored_both_ways(data, entry, task, text)
            assert via_rg == via_tirl, (task.id, answer, via_rg, via_tirl)
            rewards.add(via_tirl)
        # no answer block at all: reasoning-gym extracts None
        assert data.score_answer(None, entry) == task.score("I give up.").reward == 0.0
    assert {0.0, 1.0} <= rewards
    if operator in ("sequential", "parallel"):
        assert any(0 < r < 1 for r in rewards), rewards  # the operator's partial credit


def test_races_entries_score_through_reasoning_gyms_composite_and_lookup():
    """A RACES dataset beside a reasoning-gym generator in reasoning-gym's composite; each
    entry scores through the composite's dispatch and through `get_score_answer_fn`."""
    composite = reasoning_gym.create_dataset(
        "composite",
        seed=3,
        size=24,
        datasets=[
            DatasetSpec("tirl_races", 1.0, dict(RACES_KEYS)),
            DatasetSpec("leg_counting", 1.0, {}),
        ],
    )
    names = [entry["metadata"]["source_dataset"] for entry in composite]
    assert set(names) == {"tirl_races", "leg_counting"}
    lookup = reasoning_gym.get_score_answer_fn("tirl_races")
    for entry in composite:
        assert composite.score_answer(entry["answer"], entry) == 1.0
        if entry["metadata"]["source_dataset"] == "tirl_races":
            assert lookup(entry["answer"], entry) == 1.0
            assert lookup("Z", entry) == composite.score_answer("Z", entry) == 0.0


def test_races_curriculum_levels_set_the_composition_size():
    curriculum = create_curriculum("tirl_races")
    curriculum.set_attr_level("size", 2)
    config = curriculum.generate_configuration({"seed": 5, "size": 12})
    assert (config.min_size, config.max_size) == (1, 3)
    data = reasoning_gym.create_dataset("tirl_races", **vars(config))
    sizes = {entry["metadata"]["difficulty"]["size"] for entry in data}
    assert sizes <= {1, 2, 3} and len(sizes) > 1


# ------------------------------------------------------------------------------ export: arithmetic


@pytest.mark.parametrize("name", ["tirl_arithmetic", "tirl"])
def test_arithmetic_scores_the_same_through_reasoning_gym_and_tirl(name):
    keys = {"digits": 2} if name == "tirl_arithmetic" else {"params": {"digits": 2}}
    data = reasoning_gym.create_dataset(name, seed=11, size=12, split="test", **keys)
    source = make_source({"source": "arithmetic", "digits": 2}, seed=11)
    for i, entry in enumerate(data):
        task = source.item("test", i)
        assert entry["question"] == f"{task.problem}\n\n{ANSWER_REQUEST}"  # says the form
        assert entry["metadata"]["split"] == "test"
        assert entry["metadata"]["difficulty"] == {"digits": 2, "kind": task.meta["kind"]}
        gold = int(entry["answer"])
        answers = [str(gold), f"{gold:,}", str(gold + 1), f"{gold}.5", "x", "", None]
        for answer in answers:
            text = "I cannot tell." if answer is None else f"So \\boxed{{{answer}}}."
            assert data.score_answer(answer, entry) == task.score(text).reward, (answer, text)
        assert data.score_answer(str(gold), entry) == 1.0
        assert data.score_answer(str(gold + 1), entry) == 0.0
        # a model that follows the question: reasoning-gym extracts the answer from its block
        assert data.score_answer(extract_answer(f"It is\n<answer>{gold}</answer>"), entry) == 1.0


@pytest.mark.parametrize(
    "name, keys",
    [
        ("tirl_arithmetic", {}),
        ("tirl", {}),
        ("tirl", {"source": "reasoning_gym", "params": {"dataset": "leg_counting"}}),
        ("tirl_races", RACES_KEYS),
    ],
)
def test_every_export_scores_through_reasoning_gyms_experiment_by_entry_id(name, keys):
    """reasoning-gym's `Experiment.score_answer_with_id` reads `metadata["difficulty"]` of
    every entry (issue 45: a KeyError on tirl_arithmetic and tirl), and its score board groups
    by it."""
    composite = CompositeDataset(
        CompositeConfig(size=4, seed=2, datasets=[DatasetSpec(name, 1.0, dict(keys))]),
        version_manager=DatasetVersionManager(),
    )
    experiment = Experiment("tirl", composite)
    for entry in composite:
        assert isinstance(entry["metadata"]["difficulty"], dict)
        entry_id = entry["metadata"]["entry_id"]
        assert experiment.score_answer_with_id(entry["answer"], entry_id) == 1.0
        assert experiment.score_answer_with_id(None, entry_id) == 0.0
    assert experiment.score_board.aggregate()[name].total_scores == 8


def test_an_entry_scores_alone_after_json_through_the_generic_dataset():
    """`get_score_answer_fn` scores with a default-config dataset: the entry's metadata alone
    rebuilds its source (here a reasoning-gym dataset imported into tirl and exported back)."""
    keys = {"source": "reasoning_gym", "params": {"dataset": "leg_counting"}}
    data = reasoning_gym.create_dataset("tirl", seed=1, size=4, **keys)
    source = make_source({"source": "reasoning_gym", "dataset": "leg_counting"}, seed=1)
    lookup = reasoning_gym.get_score_answer_fn("tirl")
    for i, entry in enumerate(data):
        entry = json.loads(json.dumps(entry))
        task = source.item("train", i)
        for answer in (entry["answer"], "1" + entry["answer"], "many", None):
            text = "No answer." if answer is None else prose(answer)
            assert lookup(answer, entry) == task.score(text).reward, answer
        assert (
            lookup(entry["answer"], entry) == 1.0 and 0 < lookup("1" + entry["answer"], entry) < 1
        )


def test_the_same_seed_gives_the_same_items_and_seeds_one_apart_share_none():
    def questions(name: str, seed: int, **keys) -> list[str]:
        return [e["question"] for e in reasoning_gym.create_dataset(name, seed=seed, **keys)]

    arithmetic = questions("tirl_arithmetic", 1, size=200)
    assert arithmetic == questions("tirl_arithmetic", 1, size=200)
    assert not set(arithmetic) & set(questions("tirl_arithmetic", 2, size=200))
    races = questions("tirl_races", 1, size=20, **RACES_KEYS)
    assert races == questions("tirl_races", 1, size=20, **RACES_KEYS)
    assert races != questions("tirl_races", 2, size=20, **RACES_KEYS)
    # the contrast: reasoning-gym's own streams at seeds 1 and 2 are one stream shifted by one
    legs = questions("leg_counting", 1, size=200)
    assert legs[1:] == questions("leg_counting", 2, size=200)[:-1]


def test_bad_export_configs_are_one_line_errors_naming_the_key():
    cases = [
        ("tirl_races", {"min_size": 0}, "tirl_races.min_size"),
        ("tirl_races", {"min_size": 4, "max_size": 2}, "min_size (4) must not exceed"),
        ("tirl_races", {"mixture": {"sortt": 1.0}}, "unknown operator 'sortt'"),
        ("tirl_races", {"split": "dev"}, "tirl_races.split"),
        ("tirl_arithmetic", {"size": 0}, "tirl_arithmetic.size"),
        ("tirl_arithmetic", {"seed": -1}, "tirl_arithmetic.seed"),
        ("tirl_arithmetic", {"kinds": ["prod"]}, "tirl_arithmetic.kinds"),
        ("tirl", {"source": "nope"}, "unknown task source 'nope'"),
        ("tirl", {"params": {"seed": 3}}, "tirl.params.seed"),
    ]
    for name, keys, words in cases:
        with pytest.raises(ConfigError) as caught:  # a ValueError, as reasoning-gym's own
            reasoning_gym.create_dataset(name, **keys)
        assert words in str(caught.value) and "\n" not in str(caught.value), str(caught.value)
    with pytest.raises(TypeError, match="min_sizes"):  # reasoning-gym builds the config itself
        reasoning_gym.create_dataset("tirl_races", min_sizes=2)
    data = reasoning_gym.create_dataset("tirl_arithmetic", seed=1, size=3)
    with pytest.raises(IndexError):
        data[3]


# ------------------------------------------------------------------------------ import


def rg_source(dataset: str, seed: int = 0, **config):
    return make_source(
        {"source": "reasoning_gym", "dataset": dataset, "config": config, "stream_size": 2000},
        "data.train[0]",
        seed=seed,
    )


def test_a_score_outside_0_1_fails_closed():
    """reasoning-gym 0.1.25's spell_backward scores a word followed by extra letters by summing
    1/len per letter and comparing with 1.0 exactly: for 9 letters the sum is 1 + an ulp."""
    data = reasoning_gym.create_dataset("spell_backward", seed=1, size=1)
    entry = {"question": "Spell it backward: aaaaaaaaa", "answer": "aaaaaaaaa", "metadata": {}}
    assert data.score_answer("aaaaaaaaax", entry) > 1.0  # the package's own bug
    score = score_entry(data, entry, "<answer>aaaaaaaaax</answer>")
    assert (score.reward, score.correct) == (0.0, False) and "outside [0, 1]" in score.reason
    assert score_entry(data, entry, "<answer>aaaaaaaaa</answer>").correct


@pytest.mark.parametrize("dataset", IMPORTED)
def test_an_imported_dataset_scores_by_its_own_score_answer(dataset):
    source = rg_source(dataset)
    own = reasoning_gym.get_score_answer_fn(dataset)
    for split in ("train", "test"):
        for i in range(8):
            task = source.item(split, i)
            entry = task.meta["entry"]
            gold = entry["answer"]
            assert (
                task.problem.startswith(entry["question"].rstrip()) and "<answer>" in task.problem
            )
            assert task.answer == f"<answer>{gold}</answer>"
            good = task.score(prose(gold))
            assert (good.reward, good.correct, good.predicted) == (1.0, True, gold)
            for wrong in (f"x{gold}", f"not {gold[::-1]}!", "0"):
                if wrong == gold:
                    continue
                bad = task.score(prose(wrong))
                assert bad.reward < 1.0 and not bad.correct and bad.predicted == wrong
                assert bad.reward == own(wrong, entry)  # the dataset's own scorer, as it is
            assert task.score(f"the answer is {gold}").reward == 0.0  # no block, no answer
    # the default scorer's partial credit passes through (gold inside a longer answer)
    task = rg_source("leg_counting").item("train", 0)
    partial = task.score(prose("1" + task.meta["entry"]["answer"]))
    assert 0.0 < partial.reward < 1.0 and not partial.correct


def test_imported_splits_are_apart_and_items_deterministic():
    source = rg_source("basic_arithmetic", min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    train = [source.item("train", i) for i in range(300)]
    test = [source.item("test", i) for i in range(40)]
    # one-digit sums repeat within a split, but no question is in both
    assert len({t.problem for t in train}) < len(train)
    assert not {t.problem for t in train} & {t.problem for t in test}
    assert len({t.id for t in test}) == len(test)
    again = rg_source("basic_arithmetic", min_terms=2, max_terms=2, min_digits=1, max_digits=1)
    assert [again.item("test", i).problem for i in range(40)] == [t.problem for t in test]
    copy = pickle.loads(pickle.dumps(source))
    assert copy.item("train", 299).problem == train[299].problem
    other = rg_source("leg_counting", seed=1)
    assert [other.item("train", i).problem for i in range(20)] != [
        rg_source("leg_counting", seed=0).item("train", i).problem for i in range(20)
    ]
    small = make_source(
        {"source": "reasoning_gym", "dataset": "leg_counting", "stream_size": 3}, "d", seed=0
    )
    assert small.item("train", 5).id in {t.id for t in (small.item("train", i) for i in range(3))}


@pytest.mark.parametrize(
    "override, words",
    [
        ("dataset: leg_countin", ["data.train[0].dataset", "did you mean leg_counting"]),
        ("dataset: leg_counting, config: {min_animal: 2}", ["config.min_animal", "min_animals"]),
        ("dataset: leg_counting, config: {seed: 2}", ["config.seed", "own 'seed' key"]),
        ("dataset: leg_counting, config: {min_animals: 0}", ["min_animals must be positive"]),
        ("dataset: leg_counting, stream_size: 0", ["data.train[0].stream_size"]),
        ("config: {}", ["data.train[0].dataset"]),
    ],
)
def test_bad_import_configs_are_one_line_errors(override, words, capsys):
    assert main(["config", f"data.train=[{{source: reasoning_gym, {override}}}]"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert all(w in line for w in words), line


def without_reasoning_gym(code: str) -> subprocess.CompletedProcess:
    """Run `code` in a fresh interpreter where `import reasoning_gym` fails."""
    blocked = "import sys; sys.modules['reasoning_gym'] = None\n"
    return subprocess.run(
        [sys.executable, "-c", blocked + code], capture_output=True, text=True, timeout=120
    )


def test_without_reasoning_gym_both_directions_name_the_extra():
    proc = without_reasoning_gym(
        "import tirl.tasks.sources.reasoning_gym\nfrom tirl.cli import main\n"
        "sys.exit(main(['config', 'data.train=[{source: reasoning_gym, dataset: leg_counting}]']))"
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = proc.stderr.strip().splitlines()
    assert "data.train[0].dataset" in line and "pip install 'tirl[reasoning-gym]'" in line, line
    proc = without_reasoning_gym("import tirl.integrations.reasoning_gym")
    assert proc.returncode == 1
    assert "pip install 'tirl[reasoning-gym]'" in proc.stderr.strip().splitlines()[-1]


def test_importing_and_generating_makes_no_network_access():
    """An audit hook records every socket event while reasoning-gym is imported, its datasets
    (and tirl's) generate items and score them; there must be none."""
    code = """
import sys
events = []
sys.addaudithook(lambda name, args: events.append(name) if name.startswith("socket.") else None)
import reasoning_gym, tirl.integrations.reasoning_gym, tirl.tasks.sources.reasoning_gym
from tirl.tasks import make_source
from tirl.tasks.sources.reasoning_gym import ANSWER_REQUEST, score_entry
for name in ("leg_counting", "basic_arithmetic", "spell_backward", "tirl_races", "tirl_arithmetic"):
    data = reasoning_gym.create_dataset(name, seed=1, size=5)
    assert all(data.score_answer(e["answer"], e) == 1.0 for e in data), name
source = make_source({"source": "reasoning_gym", "dataset": "spell_backward"}, "d")
task = source.item("test", 3)
assert task.score(task.answer).reward == 1.0
print("socket events:", events)
sys.exit(1 if events else 0)
"""
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr[-2000:]


# ------------------------------------------------------------------------------ end to end


def test_tirl_train_and_eval_run_on_the_recipe(tmp_path, capsys):
    small = [f"out_dir={tmp_path}", "rl.steps=2", "rl.prompts_per_step=2", "rl.group_size=2"]
    small += ["rl.max_model_tokens=16", "data.eval=[{name: heldout, items: 4}]"]
    small += ["eval.max_model_tokens=16", "model.hidden_size=32", "model.layers=1"]
    small += ["model.vocab_size=300", "model.tokenizer_corpus_items=20"]
    assert main(["train", str(RECIPE), *small]) == 0, capsys.readouterr().err[-2000:]
    run = tmp_path / "reasoning_gym"
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    assert [r["step"] for r in records if r["phase"] == "rl"] == [0, 1]
    assert all(0.0 <= r["train/reward_mean"] <= 1.0 for r in records if r["phase"] == "rl")
    samples = [json.loads(line) for line in (run / "samples" / "code_rl_heldout.jsonl").open()]
    assert len(samples) == 4
    assert all(s["task_id"].startswith("reasoning_gym/basic_arithmetic/test/") for s in samples)
    results = json.loads((run / "eval.json").read_text())
    assert results["code"]["rl"]["heldout"]["eval/samples"] == 4
    # `tirl eval` on the trained model, with an evaluation set of another reasoning-gym dataset
    evaluation = "data.eval=[{name: legs, items: 3, source: reasoning_gym, dataset: leg_counting}]"
    argv = ["eval", str(run / "code" / "rl"), evaluation, "eval.max_model_tokens=8"]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]


def test_a_reasoning_gym_dataset_is_a_benchmark_scored_as_boxed_math():
    """`tirl eval --benchmark rg:gsm_symbolic`: the source's test items, the question alone,
    the gold answer scored as a boxed answer (not the <answer> tag training asks for)."""
    from tirl.config import ConfigError
    from tirl.eval.benchmark_eval import benchmark_tasks

    ((tasks, source),) = benchmark_tasks(["rg:gsm_symbolic"], None, 5).values()
    assert len(tasks) == 5 and source == "rg:gsm_symbolic"
    assert len({t.problem for t in tasks}) == 5 and "<answer>" not in tasks[0].problem
    for task in tasks:
        assert task.score(f"So the total is \\boxed{{{task.answer}}}.").correct
        assert not task.score(f"<answer>{task.answer}</answer>").correct
    assert [
        t.problem for t in benchmark_tasks(["rg:gsm_symbolic"], None, 5)["rg:gsm_symbolic"][0]
    ] == [t.problem for t in tasks]  # the same items again
    with pytest.raises(ConfigError, match="did you mean gsm_symbolic"):
        benchmark_tasks(["rg:gsm_symbolik"], None, 5)
