"""The analysis and report of `tirl study synth` (`tirl.studies.synth_study`).

Read from the study folder: the synthesis (`cot/stage.json`, `synth/` stage files and
`stage_times.json`), each arm's evaluations (`arms/<arm>/samples/code_<phase>_heldout.jsonl`,
greedy, the same held-out items for every arm) and training log. Written:

- `results.json`: the stages (in, kept, pass rate, seconds), per arm its SFT demonstrations and
  after SFT and after RL its held-out accuracy (with a bootstrap CI), tool calls and model
  tokens per item, and per pair of arms the paired difference of each metric after RL (and of
  accuracy after SFT) with its 95 % bootstrap CI over items (`tirl.eval.gains.paired_gain`);
  the verdict on AgentMath's claim and why;
- `study.md` and `report.html` (`tirl.report_kit`), the latter with the training curves and
  per-arm tables of `tirl.eval`'s run report, written for the arms together in `training/`.

The claim, "synthesis stages add accuracy": reproduced when the synth arm's held-out accuracy
after RL is above both other arms' beyond the noise (both paired CIs above 0); not reproduced
when it is below either beyond the noise; inconclusive otherwise (a CI that contains 0), and
when no synthesized trajectory passed (the synth arm then had no SFT at all: the claim was
never put to the test, and the stage table says where the teacher's trajectories were lost).
"""

from __future__ import annotations

import json
import math
import shutil
from itertools import combinations
from pathlib import Path

from tirl.eval.gains import paired_gain
from tirl.eval.metrics import bootstrap_ci
from tirl.files import json_text, read_jsonl, write_text
from tirl.protocol.segments import Trajectory
from tirl.report_kit import element, figure_html, html_page, html_table, md_table
from tirl.rewards.toolstats import tool_stats
from tirl.run.evaluation import Evaluation
from tirl.studies.synth_study import ARMS, EVAL_SET, VARIANT
from tirl.synth.report import stage_stats

VERDICTS = ("reproduced", "not reproduced", "inconclusive")
METRICS = (("correct", "accuracy"), ("calls", "tool calls"), ("tokens", "model tokens"))
PHASES = ("sft", "rl")


def item_values(path: Path) -> dict[str, dict[str, float]]:
    """{metric: {task_id: value}} of an evaluation's greedy samples (failed samples left out)."""
    out: dict[str, dict[str, float]] = {m: {} for m, _ in METRICS}
    for row in read_jsonl(path):
        traj = Trajectory.from_dict(row)
        if traj.score is None or traj.task_id is None:
            continue
        stats = tool_stats(traj)
        out["correct"][traj.task_id] = float(traj.score.correct)
        out["calls"][traj.task_id] = float(stats["num_calls"])
        out["tokens"][traj.task_id] = float(stats["model_tokens"])
    return out


def _mean_ci(values: dict[str, float]) -> dict:
    if not values:
        return {"n": 0, "mean": math.nan, "ci": [math.nan, math.nan]}
    xs = list(values.values())
    low, high = bootstrap_ci(xs)
    return {"n": len(xs), "mean": sum(xs) / len(xs), "ci": [low, high]}


def stage_rows(folder: Path) -> list[dict]:
    """The cot stage, then every synth stage: in, kept, pass rate, seconds, rejections."""
    cot = json.loads((folder / "cot" / "stage.json").read_text())
    times_path = folder / "synth" / "stage_times.json"
    times = json.loads(times_path.read_text()) if times_path.exists() else {}
    from_dataset = cot.get("from_dataset", 0)  # absent in a folder from before study.cot
    reasons = {"boxed answer correct": cot["correct"], "from the dataset": from_dataset}
    rows = [{"stage": f"cot ({cot_origin(from_dataset, cot['items'])})", "in": cot["items"],
             "out": cot["answered"], "pass_rate": _rate(cot["correct"], cot["items"]),
             "seconds": cot["seconds"], "reasons": reasons}]  # fmt: skip
    for s in stage_stats(folder / "synth"):
        if s["stage"] == "read":
            continue
        rows.append({"stage": s["stage"], "in": s["in"], "out": s["out"],
                     "pass_rate": _rate(s["out"], s["in"]),
                     "seconds": times.get(s["stage"], {}).get("seconds", 0.0),
                     "reasons": s["reasons"]})  # fmt: skip
    return rows


def cot_origin(from_dataset: int, items: int) -> str:
    """Who wrote the chains of thought: "dataset", "teacher" or "dataset + teacher"."""
    if from_dataset == 0:
        return "teacher"
    return "dataset" if from_dataset == items else "dataset + teacher"


def _rate(k: int, n: int) -> float:
    return k / n if n else math.nan


def verdict(n_synth: int, vs: dict[str, dict]) -> tuple[str, str]:
    """The claim's verdict and why, from the synth arm's paired accuracy differences after RL
    against the scripted and the no-SFT arms ({"scripted": gain, "none": gain})."""
    if n_synth == 0:
        return "inconclusive", (
            "no synthesized trajectory passed every stage, so the synth arm had no SFT and the"
            " claim was never put to the test: the teacher's synthesis gave nothing to train on"
        )
    lows = {k: g["ci"][0] for k, g in vs.items()}
    highs = {k: g["ci"][1] for k, g in vs.items()}
    text = "; ".join(
        f"vs {k}: {g['D']:+.3f} [{g['ci'][0]:+.3f}, {g['ci'][1]:+.3f}] over {g['n']} items"
        for k, g in vs.items()
    )
    if any(math.isnan(x) for x in lows.values()):
        return "inconclusive", f"an arm has no evaluated items ({text})"
    if all(x > 0 for x in lows.values()):
        return "reproduced", f"the synth arm is above both beyond the noise ({text})"
    below = [k for k, x in highs.items() if x < 0]
    if below:
        return (
            "not reproduced",
            f"the synth arm is below {', '.join(below)} beyond the noise ({text})",
        )
    return "inconclusive", f"a paired CI contains 0 ({text}; {n_synth} synthesized trajectories)"


def analyse(folder: Path) -> dict:
    arms: dict[str, dict] = {}
    values: dict[str, dict[str, dict]] = {}
    for arm in ARMS:
        run = folder / "arms" / arm
        info = json.loads((run / "eval.json").read_text())
        arms[arm] = {"sft_examples": info["sft_examples"], "wall_s": round(info["wall_s"], 1),
                     "same_as": info.get("same_as")}  # fmt: skip
        for phase in PHASES:
            path = run / "samples" / f"{VARIANT}_{phase}_{EVAL_SET}.jsonl"
            vals = item_values(path)
            values.setdefault(arm, {})[phase] = vals
            arms[arm][phase] = {m: _mean_ci(vals[m]) for m, _ in METRICS}
    pairs = []
    for a, b in combinations(ARMS, 2):  # a - b, the synth arm first
        row = {"pair": f"{a} - {b}", "a": a, "b": b}
        for m, _ in METRICS:
            row[m] = paired_gain(values[b]["rl"][m], values[a]["rl"][m])
        row["correct_sft"] = paired_gain(values[b]["sft"]["correct"], values[a]["sft"]["correct"])
        pairs.append(row)
    vs = {p["b"]: p["correct"] for p in pairs if p["a"] == "synth"}
    word, why = verdict(arms["synth"]["sft_examples"], vs)
    timings = folder / "timings.json"
    return {
        "claim": "AgentMath: the synthesis stages add accuracy (SFT on synthesized trajectories,"
        " then RL, beats SFT on scripted demonstrations and no SFT, each then the same RL)",
        "verdict": word,
        "why": why,
        "stages": stage_rows(folder),
        "synthesized": arms["synth"]["sft_examples"],
        "problems": sum(1 for _ in read_jsonl(folder / "problems" / "train.jsonl")),
        "arms": arms,
        "pairs": pairs,
        "timings": json.loads(timings.read_text()) if timings.exists() else {},
    }


# ------------------------------------------------------------------------------ the report


def _f(x: float, spec: str = ".3f") -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def _ci(c: dict, spec: str = ".3f") -> str:
    return f"{_f(c['mean'], spec)} [{_f(c['ci'][0], spec)}, {_f(c['ci'][1], spec)}]"


def _gain(g: dict, spec: str = "+.3f") -> str:
    return f"{_f(g['D'], spec)} [{_f(g['ci'][0], spec)}, {_f(g['ci'][1], spec)}]"


def tables(results: dict) -> list[tuple[str, list, list, str]]:
    """(heading, header, rows, alignment) of the study's tables."""
    stages = [[s["stage"], s["in"], s["out"], _f(s["pass_rate"]), _f(s["seconds"], ".1f"),
               "; ".join(f"{k}: {v}" for k, v in s["reasons"].items()) or "-"]
              for s in results["stages"]]  # fmt: skip
    arms = []
    for arm, r in results["arms"].items():
        name = f"{arm} (= {r['same_as']}: the same run)" if r.get("same_as") else arm
        arms.append([name, r["sft_examples"], _ci(r["sft"]["correct"]), _ci(r["rl"]["correct"]),
                     _f(r["rl"]["calls"]["mean"], ".2f"), _f(r["rl"]["tokens"]["mean"], ".1f"),
                     r["rl"]["correct"]["n"], _f(r["wall_s"], ".0f")])  # fmt: skip
    pairs = [[p["pair"], _gain(p["correct_sft"]), _gain(p["correct"]), _gain(p["calls"], "+.2f"),
              _gain(p["tokens"], "+.1f")] for p in results["pairs"]]  # fmt: skip
    return [
        ("Synthesis stages (pass rate = kept / in; the cot stage's = boxed answer correct / in)",
         ["stage", "in", "kept", "pass rate", "seconds", "rejections / notes"], stages, "->>>>-"),
        ("Arms on the held-out items (greedy; accuracy with its 95 % bootstrap CI)",
         ["arm", "SFT demos", "accuracy after SFT", "accuracy after RL", "tool calls (RL)",
          "model tokens (RL)", "items", "wall s"], arms, "->>>>>>>"),
        ("Pairs of arms: paired differences on the same items, 95 % bootstrap CI",
         ["pair", "accuracy after SFT", "accuracy after RL", "tool calls after RL",
          "model tokens after RL"], pairs, "->>>>"),
    ]  # fmt: skip


def _summary(results: dict) -> list[str]:
    return [
        f"Claim: {results['claim']}.",
        f"Verdict: **{results['verdict']}**: {results['why']}.",
        f"Synthesized trajectories that passed every stage: {results['synthesized']} of"
        f" {results['problems']} problems.",
    ]


def markdown(results: dict, command: str) -> str:
    lines = ["# tirl study synth: AgentMath's synthesis with a real teacher", ""]
    lines += [*_summary(results), ""]
    for heading, header, rows, align in tables(results):
        lines += [f"## {heading}", "", md_table(header, rows, align), ""]
    runs = results["timings"].get("runs", [])
    lines += ["## Wall time", "", "One line per run of the folder (a resumed study adds one):", ""]
    lines += [f"- synthesis {r.get('synthesis_s')} s, arms {r.get('arms_s')} s" for r in runs]
    lines += ["", f"Command: `{command}`", "", "Curves: report.html (and training/report.html)."]
    return "\n".join(lines) + "\n"


def html(results: dict, folder: Path) -> str:
    body = [element("h1", "tirl study synth: AgentMath's synthesis with a real teacher")]
    body += [element("p", line.replace("**", "")) for line in _summary(results)]
    for heading, header, rows, align in tables(results):
        body += [element("h2", heading), html_table(header, rows, align)]
    plots = sorted((folder / "training" / "plots").glob("*.png"))
    if plots:
        body.append(element("h2", "Training (each arm a line; training/report.html has more)"))
        body += [figure_html(p, p.stem.replace("_", " ")) for p in plots]
    return html_page("tirl study synth", body)


def training_report(folder: Path, evaluation: Evaluation) -> None:
    """`tirl.eval`'s run report over the arms together, in `training/`: each arm one variant
    (its metrics and samples under its name), so the curves and the SFT -> RL gains per arm
    come out as for a run."""
    out = folder / "training"
    shutil.rmtree(out, ignore_errors=True)
    records, results = [], {}
    for arm in ARMS:
        run = folder / "arms" / arm
        for rec in read_jsonl(run / "metrics.jsonl"):
            records.append({**rec, "variant": arm})
        results[arm] = json.loads((run / "eval.json").read_text()).get(VARIANT, {})
        for phase in PHASES:
            src = run / "samples" / f"{VARIANT}_{phase}_{EVAL_SET}.jsonl"
            (out / "samples").mkdir(parents=True, exist_ok=True)
            shutil.copyfile(src, out / "samples" / f"{arm}_{phase}_{EVAL_SET}.jsonl")
    metrics = out / "metrics.jsonl"
    write_text(metrics, "".join(json_text(r, indent=None) + "\n" for r in records))
    evaluation.write_report(out, eval_results=results, metrics_path=metrics,
                            title="tirl study synth: the arms' training")  # fmt: skip


def write_study_report(folder: Path, evaluation: Evaluation, command: str = "") -> dict:
    """Analyse the study folder; write results.json, study.md, training/ and report.html."""
    folder = Path(folder)
    results = analyse(folder)
    write_text(folder / "results.json", json_text(results))
    training_report(folder, evaluation)
    write_text(folder / "study.md", markdown(results, command or "tirl study synth"))
    write_text(folder / "report.html", html(results, folder))
    return results
