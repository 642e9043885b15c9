"""`tirl ablate`: RL from one SFT model under several switch combinations, same seeds, one report.

For each seed the model is fine-tuned once per (boundary mode, tools on or off) among the
variants (the demonstrations are written in that mode; a variant with `variants=[text]` is
text-only, fine-tuned and trained without the interpreter; no other RL switch changes SFT),
then every variant starts RL from its SFT model and is evaluated on the same held-out items.
A variant is a list of config overrides on top of the base config.

Presets:
- `cir`: the full CIR recipe (§2.3.2: REINFORCE++ with the +1 / -1 reward, every variant
  included), then each of its six strategies removed in turn. "Removed" means the alternative
  the paper argues against: stop-token boundaries, tool output trained on, an entropy bonus, a
  KL penalty, symmetric clipping, a fixed budget.
- `cir-claims`: the full CIR recipe against the four arms that test its claims on a real model
  (issue 46): text-only, stop-token boundaries, tool output trained on, a fixed budget. Each
  arm's verdict, paired by item with a bootstrap CI, is `tirl.studies.ablate_claims`.
- `agentmath`: GRPO, then adaptive batches, the composite reward, and both.
- `advantages`: the advantage estimators side by side.

Outputs under the ablation folder: `ablation.md` (the comparison table: mean and spread over
seeds, difference from the first variant), `report.html` / `report.md` with training curves
averaged over seeds, `results.json`, `claims.json` (the CIR claims' verdicts, where arms
name them), and per seed the metrics, samples and checkpoints.

The ablation folder is locked while it runs. A fresh run starts afresh: what an earlier
ablation wrote there (`tirl.train.run_folder.ABLATE_ENTRIES`) is removed first, anything else is
left, and a non-empty folder tirl did not make is refused (`tirl.train.run_folder`). With
`resume`, a killed ablation goes on where it stopped, given the same config, variants and seeds
(`ablation.json`): finished SFT models, RL runs and evaluations are loaded, an RL run killed
midway continues from its last checkpoint (`rl.checkpoint_every`), an SFT killed midway starts
over; nothing is logged twice (`tirl.train.pipeline.Pipeline`).
"""

from __future__ import annotations

import asyncio
import copy
import json
import math
import statistics
from collections import defaultdict
from dataclasses import replace
from pathlib import Path

from tirl.config import ConfigError, apply_overrides, from_dict, to_dict
from tirl.files import json_text, read_jsonl, write_text
from tirl.report_kit import md_table
from tirl.run.build import sandbox_for
from tirl.run.config import RunConfig
from tirl.run.evaluation import Evaluation
from tirl.studies.ablate_claims import claim_cells, claim_rows
from tirl.train.pipeline import Pipeline, flat_keys, quiet_transformers, seed_everything
from tirl.train.run_folder import ABLATE_ENTRIES, claim_folder

CIR = ["rl.advantage=reinforce++", "rl.reward=binary"]  # CIR's estimator and +1 / -1 reward

PRESETS: dict[str, dict[str, list[str]]] = {
    "cir": {
        "cir": [*CIR],
        "-exact-match": [*CIR, "protocol.boundary=stop_token"],
        "-tool-mask": [*CIR, "rl.mask_tool_output=false"],
        "-no-entropy": [*CIR, "rl.entropy_coef=0.01"],
        "-no-kl": [*CIR, "rl.kl_coef=0.05"],
        "-clip-higher": [*CIR, "rl.clip_high=0.2"],
        "-budget-growth": [*CIR, "rl.budget_schedule=[[0, 4]]"],
    },
    "cir-claims": {
        "cir": [*CIR],
        "text-only": [*CIR, "variants=[text]"],
        "-exact-match": [*CIR, "protocol.boundary=stop_token"],
        "-tool-mask": [*CIR, "rl.mask_tool_output=false"],
        "-budget-growth": [*CIR, "rl.budget_schedule=[[0, 4]]"],
    },
    "agentmath": {
        "grpo": [],
        "+adaptive": ["rl.adaptive_batch=true"],
        "+composite": ["rl.reward=composite"],
        "+both": ["rl.adaptive_batch=true", "rl.reward=composite"],
    },
    "advantages": {
        name: [f"rl.advantage={name}"]
        for name in ("grpo", "drgrpo", "reinforce++", "reinforce++-baseline", "rloo")
    },
}

_STOP_TOKEN_NOTE = (
    "`-exact-match` starts from its own SFT model (`sft-stop_token`), fine-tuned on the same"
    " demonstrations written in stop-token form: the model writes the ```output marker"
    " itself, and only then does its code run (CIR Figure 1a)."
)
PRESET_NOTES: dict[str, str] = {
    "cir": _STOP_TOKEN_NOTE,
    "cir-claims": _STOP_TOKEN_NOTE
    + (
        " `text-only` starts from its own SFT model (`sft-text`), fine-tuned on the same tasks"
        " answered in prose, and never runs code."
    ),
}

QUICK_RL_STEPS = 4  # --quick: RL steps per arm (at most), one seed, at most QUICK_EVAL_ITEMS
QUICK_EVAL_ITEMS = 50  # held-out items per eval set

TABLE_METRICS = (  # (eval key, header, format)
    ("eval/accuracy", "accuracy", ".3f"),
    ("eval/avg@k", "avg@k", ".3f"),
    ("tools/calls_mean", "calls", ".2f"),
    ("tools/ok_share", "ok share", ".3f"),
    ("length/model_tokens_mean", "model tok", ".1f"),
)


def uses_tools(cfg: RunConfig) -> bool:
    """A variant runs the interpreter unless it is text-only (`variants=[text]`)."""
    return "code" in cfg.variants


def sft_name(base: RunConfig, cfg: RunConfig) -> str:
    """The SFT model a variant starts from: `sft` for the base config's boundary with tools,
    `sft-<boundary>` for another boundary, `sft-text` without tools."""
    if not uses_tools(cfg):
        return "sft-text"
    if cfg.protocol.boundary == base.protocol.boundary:
        return "sft"
    return f"sft-{cfg.protocol.boundary}"


def quick_config(cfg: RunConfig) -> RunConfig:
    """`--quick`: the same ablation in a fraction of the time, for a look or for CI: at most
    `QUICK_RL_STEPS` RL steps and `QUICK_EVAL_ITEMS` items per held-out set (SFT unchanged:
    the arms must start from the same model as in the full form)."""
    evals = [{**e, "items": min(int(e.get("items", 200)), QUICK_EVAL_ITEMS)} for e in cfg.data.eval]
    rl = replace(cfg.rl, steps=min(cfg.rl.steps, QUICK_RL_STEPS))
    return replace(cfg, rl=rl, data=replace(cfg.data, eval=evals))


def variant_config(base: RunConfig, overrides: list[str], where: str) -> RunConfig:
    """`base` with `overrides` applied, validated; errors name the variant."""
    try:
        return from_dict(RunConfig, apply_overrides(to_dict(base), overrides))
    except ConfigError as e:
        raise ConfigError(f"variant {where!r}: {e}", e.key) from None


def parse_variants(preset: str | None, specs: list[str]) -> dict[str, list[str]]:
    """A preset's variants, plus `NAME:key=value,key=value` specs from the command line."""
    if preset is None and not specs:
        raise ConfigError(f"name a --preset ({', '.join(PRESETS)}) or give --variant specs")
    if preset is not None and preset not in PRESETS:
        raise ConfigError(f"unknown preset {preset!r}; known: {', '.join(PRESETS)}")
    variants = dict(PRESETS[preset]) if preset else {}
    for spec in specs:
        name, sep, overrides = spec.partition(":")
        if not sep or not name:
            raise ConfigError(f"--variant {spec!r}: expected NAME:key=value[,key=value...]")
        variants[name] = [o for o in overrides.split(",") if o]
    return variants


async def _run_seed(
    base: RunConfig,
    variants: dict[str, list[str]],
    seed_dir: Path,
    evaluation: Evaluation,
    resume: bool,
) -> dict:
    """One seed: an SFT model per (boundary mode, tools), then RL of every variant from it."""
    pipeline = Pipeline(base, seed_dir, evaluation, resume=resume)
    pipeline.prepare()
    configs = {name: variant_config(base, overrides, name) for name, overrides in variants.items()}
    async with sandbox_for(base) as sandbox:
        sft_states = {}  # one SFT model per mode: its demonstrations are written in it
        for cfg in configs.values():
            name = sft_name(base, cfg)
            if name in sft_states:
                continue
            pipeline.cfg = replace(base, protocol=cfg.protocol)
            pipeline.prepare(pipeline.tokenizer)  # the renderer in this boundary mode
            seed_everything(base.seed)
            model = pipeline.make_model()
            await pipeline.sft(name, model, sandbox, use_tools=uses_tools(cfg))
            sft_states[name] = copy.deepcopy(model.state_dict())
        for name, cfg in configs.items():
            pipeline.cfg = cfg
            pipeline.prepare(pipeline.tokenizer)
            model.load_state_dict(sft_states[sft_name(base, cfg)])
            seed_everything(cfg.seed)
            await pipeline.rl(name, model, sandbox, uses_tools(cfg), cfg)
    pipeline.logger.close()
    return pipeline.results


CLAIMS_NOTE = (
    "Held-out greedy correctness after RL, paired by item (pooled over seeds as (seed, item)"
    " pairs): the mean of reference - arm with its 95 % bootstrap CI over pairs; reproduced"
    " when the CI lies above 0, not reproduced when below, inconclusive when it contains 0"
    " (claims.json)."
)


def _mean_records(paths: list[Path]) -> list[dict]:
    """Per (variant, phase, step), the mean of each numeric metric over the seeds' runs."""
    groups: dict[tuple, list[dict]] = defaultdict(list)
    for path in paths:
        for record in read_jsonl(path):
            groups[(record["variant"], record["phase"], record["step"])].append(record)
    merged = []
    for (variant, phase, step), records in groups.items():
        keys = {k for r in records for k, v in r.items() if isinstance(v, (int, float))}
        row = {"variant": variant, "phase": phase, "step": step}
        for key in keys - {"step"}:
            values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
            row[key] = statistics.fmean(values)
        merged.append(row)
    return merged


def first_set(phase: dict) -> dict:
    """The metrics of a phase's first eval set (`{set: metrics}`; the table compares on it)."""
    return next(iter(phase.values()), {}) if phase else {}


def table_cells(per_seed: list[dict], variants: dict[str, list[str]]) -> tuple[list, list]:
    """The comparison's header and rows: one row per variant, mean ± sd over seeds, and the
    accuracy difference from the first variant (the reference recipe)."""

    def values(name: str, key: str) -> list[float]:
        found = [first_set(r.get(name, {}).get("rl", {})).get(key) for r in per_seed]
        return [x for x in found if isinstance(x, (int, float)) and math.isfinite(x)]

    reference = list(variants)[0]
    ref_acc = statistics.fmean(values(reference, "eval/accuracy"))
    headers = ["variant", "overrides", *(h for _, h, _ in TABLE_METRICS), "Δ accuracy"]
    rows = []
    for name, overrides in variants.items():
        shown = ", ".join(f"`{o}`" for o in overrides)
        if name == reference:
            shown = f"{shown} (reference)".strip()
        cells = [name, shown or "(base config)"]
        for key, _, fmt in TABLE_METRICS:
            xs = values(name, key)
            if not xs:
                cells.append("–")
                continue
            spread = f" ± {statistics.stdev(xs):{fmt}}" if len(xs) > 1 else ""
            cells.append(f"{statistics.fmean(xs):{fmt}}{spread}")
        delta = statistics.fmean(values(name, "eval/accuracy")) - ref_acc
        cells.append("–" if name == reference else f"{delta:+.3f}")
        rows.append(cells)
    return headers, rows


def comparison_table(per_seed: list[dict], variants: dict[str, list[str]]) -> str:
    """Markdown: `table_cells`' table, then each SFT start's greedy accuracy."""
    lines = [md_table(*table_cells(per_seed, variants)), ""]
    for name in sorted({k for r in per_seed for k in r if k.startswith("sft")}):
        sft = [first_set(r[name]["sft"])["eval/accuracy"] for r in per_seed if name in r]
        lines.append(f"SFT starting point `{name}`, greedy accuracy: {statistics.fmean(sft):.3f}.")
    return "\n".join(lines)


def run_ablation(
    base: RunConfig,
    variants: dict[str, list[str]],
    seeds: list[int],
    out_dir: Path,
    evaluation: Evaluation,
    note: str = "",
    resume: bool = False,
) -> Path:
    """Run every variant on every seed (with `resume`, what a killed run left unfinished);
    write the comparison (and, through `evaluation`, the report); return the folder."""
    for name, overrides in variants.items():
        variant_config(base, overrides, name)  # every variant valid before anything runs
    quiet_transformers(base)
    out_dir = Path(out_dir)
    spec = {"config": to_dict(base), "variants": variants, "seeds": seeds}
    with claim_folder(out_dir, "ablate", ABLATE_ENTRIES, resume=resume):
        if resume:
            check_same_ablation(spec, out_dir)
        else:
            write_text(out_dir / "ablation.json", json_text(spec))
        _run_ablation(base, variants, seeds, out_dir, evaluation, note, resume)
    return out_dir


def check_same_ablation(spec: dict, out_dir: Path) -> None:
    """An ablation is resumed only with the config, variants and seeds that started it."""
    path = out_dir / "ablation.json"
    if not path.is_file():
        raise ConfigError(f"cannot resume {out_dir}: it has no ablation.json (no ablation there)")
    saved = json.loads(path.read_text(encoding="utf-8"))
    ours, theirs = flat_keys(spec), flat_keys(saved)
    diffs = sorted(k for k in ours.keys() | theirs.keys() if ours.get(k) != theirs.get(k))
    if diffs:
        shown = ", ".join(diffs[:5]) + (", ..." if len(diffs) > 5 else "")
        raise ConfigError(
            f"cannot resume {out_dir}: it was started with other settings ({shown});"
            " resume with the same config, overrides, variants, seeds and --quick"
        )


def _run_ablation(
    base: RunConfig,
    variants: dict[str, list[str]],
    seeds: list[int],
    out_dir: Path,
    evaluation: Evaluation,
    note: str,
    resume: bool,
) -> None:
    per_seed = []
    for seed in seeds:
        cfg = replace(base, seed=seed)
        seed_dir = out_dir / f"seed{seed}"
        per_seed.append(asyncio.run(_run_seed(cfg, variants, seed_dir, evaluation, resume)))
    write_text(out_dir / "results.json", json_text(per_seed))
    table = comparison_table(per_seed, variants)
    eval_set = base.data.eval[0]["name"]  # the table compares on the first set (first_set)
    claims = claim_rows([out_dir / f"seed{s}" for s in seeds], list(variants), eval_set)
    write_text(out_dir / "claims.json", json_text(claims))
    reference = list(variants)[0]
    claims_tables = []
    if claims:
        claims_tables = [(f"CIR's claims: {reference} against each arm", CLAIMS_NOTE,
                          *claim_cells(claims, reference))]  # fmt: skip
    seeds_text = ", ".join(map(str, seeds))
    parts = [
        "# Ablation",
        f"Seeds: {seeds_text}. Mean ± sd over seeds; held-out greedy accuracy and avg@k after RL.",
        table,
        *(
            f"## {title}\n\n{text}\n\n{md_table(header, cells)}"
            for title, text, header, cells in claims_tables
        ),  # fmt: skip
        note,
        "Curves (means over seeds): report.html",
    ]
    write_text(out_dir / "ablation.md", "\n\n".join(p for p in parts if p) + "\n")
    merged = out_dir / "metrics.jsonl"
    records = _mean_records([out_dir / f"seed{s}" / "metrics.jsonl" for s in seeds])
    write_text(merged, "".join(json_text(r, indent=None) + "\n" for r in records))
    first = per_seed[0]
    evaluation.write_report(
        out_dir,
        eval_results=first,
        metrics_path=merged,
        title=f"tirl ablate (curves: mean over seeds {seeds_text}; table: seed {seeds[0]})",
        config=to_dict(base),
        tables=[
            (f"Variants after RL (seeds {seeds_text})", "", *table_cells(per_seed, variants)),
            *claims_tables,
        ],  # fmt: skip
    )
    print(table)
