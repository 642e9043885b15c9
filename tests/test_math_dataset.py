"""`tirl train` on a math dataset file scored through `tirl.rewards.verify` (issue 15).

The problems have answers that need a real verifier: fractions, intervals and polynomials. The
SFT file (as `tirl synth run` writes it) answers each one in an equivalent form that differs from
the gold text (`0.75` for `\\frac{3}{4}`, `(1,2]` for `(1, 2]`, a reordered polynomial), and one
problem in five with a wrong value. The model learns those answers, so its evaluation answers
are judged correct only through equivalence, and some are wrong. The verdicts stored in the
trajectories file must be exactly what the verifier says of (gold, predicted).
"""

from __future__ import annotations

import json
from fractions import Fraction

from tiny_run import TINY

from tirl.cli import main
from tirl.rewards.verify import verify_answer

SMALL = [o for o in TINY if not o.startswith(("data.eval=", "sft.", "rl.", "model."))]


def problems() -> list[tuple[str, str, str]]:
    """(problem, gold answer, the equivalent answer the demonstration gives)."""
    rows = []
    for num, den in [(1, 4), (3, 4), (1, 5), (2, 5), (3, 8), (5, 8), (4, 5), (7, 8)]:
        value = Fraction(num, den)
        rows.append(
            (f"Reduce {2 * num}/{2 * den}.", f"\\frac{{{num}}}{{{den}}}", str(float(value)))
        )
    for a, b in [(1, 2), (0, 3), (2, 7), (4, 9), (5, 6), (3, 8), (6, 10), (1, 9)]:
        rows.append((f"Write {a} < x <= {b} as an interval.", f"({a}, {b}]", f"({a},{b}]"))
    for a in range(1, 9):
        gold = f"x^2+{2 * a}x+{a * a}"
        rows.append((f"Expand (x+{a})^2.", gold, f"{a * a}+{2 * a}x+x^2"))
    return rows


def write_files(tmp_path) -> tuple[str, str]:
    rows = problems()
    data = tmp_path / "math.jsonl"
    data.write_text("".join(json.dumps({"problem": p, "answer": g}) + "\n" for p, g, _ in rows))
    records = []
    for i, (problem, gold, given) in enumerate(rows):
        if i % 5 == 4:  # a wrong value: the verifier must say no
            given = "42"
        steps = [
            {"kind": "code", "text": f"print({given!r})", "output": given},
            {"kind": "text", "text": f"The answer is \\boxed{{{given}}}."},
        ]
        records.append(
            {"problem": problem, "answer": gold, "protocol": "cir_fences", "steps": steps}
        )
    demos = tmp_path / "demos.jsonl"
    demos.write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(data), str(demos)


def test_a_math_dataset_trains_and_its_verdicts_are_the_verifiers(tmp_path, capsys):
    data, demos = write_files(tmp_path)
    argv = ["train", f"out_dir={tmp_path}", "name=math", *SMALL]
    argv += [
        f"data.train=[{{source: dataset, path: '{data}', test_share: 0}}]",
        # the same rows as an evaluation set: the model answers what it was taught
        f"data.eval=[{{name: taught, source: dataset, path: '{data}', test_share: 1, items: 24}}]",
        f"sft.data={demos}",
        "sft.steps=300",
        "sft.batch_size=8",
        "sft.lr=3e-3",
        "sft.examples=24",
        "rl.steps=1",
        "rl.prompts_per_step=2",
        "rl.group_size=2",
        "rl.max_model_tokens=48",
        "rl.reward=binary",
        "eval.max_model_tokens=48",
        "model.hidden_size=64",
        "model.layers=2",
        "model.heads=2",
        "model.max_positions=160",
        "model.tokenizer_corpus_items=48",
    ]
    assert main(argv) == 0, capsys.readouterr().err[-2000:]
    samples = tmp_path / "math" / "samples" / "code_sft_taught.jsonl"
    trajs = [json.loads(line) for line in samples.open()]
    assert len(trajs) == 24
    verdicts = []
    for traj in trajs:
        score, gold = traj["score"], traj["meta"]["gold"]
        expected = verify_answer(gold, score["predicted"]).correct
        assert score["correct"] == expected, score
        verdicts.append((score["correct"], score["predicted"], gold))
    # the run exercised the verifier both ways, and equivalence (not string equality) decided
    assert any(ok and predicted != gold for ok, predicted, gold in verdicts), verdicts
    assert any(not ok for ok, _, _ in verdicts), verdicts
    rl = [json.loads(line) for line in (tmp_path / "math" / "metrics.jsonl").open()]
    assert any(r.get("phase") == "rl" for r in rl)  # RL ran on verifier-scored rewards
