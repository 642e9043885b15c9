"""Turn a run folder into a report a researcher wants to look at.

Inputs are plain data written by training and evaluation: `metrics.jsonl` (one JSON object per
logged step, `{"variant", "phase", "step", ...namespaced metrics}`), the eval results dict
(`{variant: {phase: {eval set: {"eval/accuracy": ..., ...}}}}`, as `tirl train` writes it; a
phase may also hold one set's metrics directly) and a few sample `Trajectory` objects. With
several eval sets, a row's phase reads "rl: <set>".
Outputs, under the run folder:

- `plots/*.png`: one figure per metric family, code vs text on the same axes, in the spirit of
  CIR's Figure 2 (response length over RL, with the interaction-budget stages marked) and
  Figure 4 (code pass rate over RL); with `rl.curriculum` on, each bucket's pass rate and
  share drawn over RL (`curriculum.png`);
- `report.md`: summary tables, the plots as relative image links, sample trajectories;
- `report.html`: one self-contained file (plots inlined as base64, no external assets) whose
  sample trajectories are drawn by `tirl.eval.viewer`: model and interpreter tokens in two
  colours, a toggle that greys out every token masked from the loss, a correct/wrong filter.

Scope: this module reads and draws; it computes no new statistics beyond last values and sums.
It does not read checkpoints or call a model; it splits segments into tokens only when given the
tokenizer (a segment with ids but no text is otherwise shown as a token count). Any metric may
be missing: a figure, panel or column with no data is left out rather than drawn empty.
"""

from __future__ import annotations

import json
import math
import re
import warnings
from collections.abc import Iterable, Sequence
from pathlib import Path

from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from tirl.eval import viewer
from tirl.eval.gains import comparison_cells, gains_cells, other_gains, rl_gains
from tirl.eval.signal import rl_signal_notes
from tirl.files import json_text, write_text
from tirl.protocol.segments import Trajectory
from tirl.report_kit import element, figure, figure_html, html_page, html_table, md_table, save_png

VARIANT_ORDER = ("code", "text")
PHASE_ORDER = ("base", "before_sft", "sft", "rl")

# (row key, eval metric key, column header, number format). One table drives summary_rows and
# all three renderings so they cannot disagree.
SUMMARY_COLUMNS: tuple[tuple[str, str, str, str], ...] = (
    ("accuracy", "eval/accuracy", "accuracy", ".3f"),
    ("avg@k", "eval/avg@k", "avg@k", ".3f"),
    ("k", "eval/k", "k", "d"),
    ("n_items", "eval/n_items", "n", "d"),
    ("calls", "tools/calls_mean", "calls", ".2f"),
    ("ok_share", "tools/ok_share", "ok share", ".3f"),
    ("error_share", "tools/error_share", "err share", ".3f"),
    ("last_ok_rate", "tools/last_ok_rate", "last ok", ".3f"),
    ("model_tokens", "length/model_tokens_mean", "model tok", ".1f"),
    ("tool_tokens", "length/tool_tokens_mean", "tool tok", ".1f"),
    ("eval_s", "time/eval_s", "eval s", ".1f"),
)
TERMINAL_COLUMNS = ("accuracy", "avg@k", "k", "n_items", "calls", "ok_share", "model_tokens")
_COLUMN_SPEC = {key: (header, fmt) for key, _, header, fmt in SUMMARY_COLUMNS}

# Fixed colours so "code" is the same blue in every figure.
_VARIANT_COLOURS = {"code": "#1f77b4", "text": "#ff7f0e"}
_EXTRA_COLOURS = (
    "#2ca02c",
    "#d62728",
    "#9467bd",
    "#8c564b",
    "#e377c2",
    "#7f7f7f",
    "#bcbd22",
    "#17becf",
)


# ---------------------------------------------------------------------------- reading inputs


def read_metrics(path: Path) -> list[dict]:
    """Read `metrics.jsonl`; a missing file is an empty run.

    A line that is not a JSON object (typically the half-written last line of a killed run) is
    skipped with a warning naming the file and line, so one bad line does not cost the report.
    """
    path = Path(path)
    if not path.exists():
        return []
    records = []
    for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as e:
            warnings.warn(f"{path}:{lineno}: skipped, not JSON ({e.msg})", stacklevel=2)
            continue
        if not isinstance(record, dict):
            warnings.warn(f"{path}:{lineno}: skipped, not a JSON object", stacklevel=2)
            continue
        # variant and phase are grouping keys: make them strings once, here.
        record["variant"] = str(record.get("variant", "?"))
        record["phase"] = str(record.get("phase", "?"))
        records.append(record)
    return records


def _number(value) -> float | None:
    """A finite float, or None for anything missing, non-numeric or NaN/inf."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _ordered(names: Iterable[str], preferred: Sequence[str]) -> list[str]:
    names = set(names)
    return [n for n in preferred if n in names] + sorted(names - set(preferred))


def _variants(records: list[dict]) -> list[str]:
    return _ordered((r["variant"] for r in records), VARIANT_ORDER)


def _series(
    records: list[dict], variant: str, phase: str, key: str
) -> tuple[list[float], list[float]]:
    """(steps, values) of one metric for one variant and phase, sorted by step."""
    points = []
    for i, r in enumerate(records):
        if r["variant"] != variant or r["phase"] != phase:
            continue
        value = _number(r.get(key))
        if value is None:
            continue
        step = _number(r.get("step"))
        points.append((step if step is not None else float(i), value))
    points.sort(key=lambda p: p[0])
    return [p[0] for p in points], [p[1] for p in points]


# ---------------------------------------------------------------------------- tables


def eval_sets_of(phase_results: dict) -> list[tuple[str | None, dict]]:
    """[(eval set, metrics)] of one phase's results: `{set: metrics}`, or the metrics of a
    single unnamed set (None)."""
    if not isinstance(phase_results, dict):
        return [(None, {})]
    if phase_results and all(isinstance(v, dict) for v in phase_results.values()):
        return list(phase_results.items())
    return [(None, phase_results)]


def summary_rows(eval_results: dict) -> list[dict]:
    """One row per (variant, phase, eval set) of the eval results, in a stable order.

    Each row has "variant", "phase" (with the set's name, "rl: races", when there are several
    sets), "eval_set" and every key of `SUMMARY_COLUMNS` ("accuracy", "calls", "ok_share",
    "model_tokens", ...); a metric the evaluation did not record is None.
    """
    found = []
    for variant in _ordered(eval_results or {}, VARIANT_ORDER):
        phases = eval_results[variant]
        if not isinstance(phases, dict):
            continue
        for phase in _ordered(phases, PHASE_ORDER):
            for name, metrics in eval_sets_of(phases[phase]):
                found.append((variant, phase, name, metrics))
    several = len({name for _, _, name, _ in found}) > 1
    rows = []
    for variant, phase, name, metrics in found:
        label = f"{phase}: {name}" if several and name is not None else phase
        row = {"variant": variant, "phase": label, "eval_set": name}
        for key, metric, _, _ in SUMMARY_COLUMNS:
            row[key] = _number(metrics.get(metric))
        rows.append(row)
    return rows


def _format_value(value, fmt: str) -> str:
    if value is None:
        return "-"
    if fmt == "d":
        return str(round(value))
    return format(value, fmt)


def _present_columns(rows: list[dict], keys: Iterable[str]) -> list[str]:
    """The keys that have a value in at least one row (an all-empty column is noise)."""
    return [k for k in keys if any(r.get(k) is not None for r in rows)]


def _table_cells(rows: list[dict], keys: Sequence[str]) -> tuple[list[str], list[list[str]]]:
    header = ["variant", "phase"] + [_COLUMN_SPEC[k][0] for k in keys]
    body = [
        [str(r.get("variant", "")), str(r.get("phase", ""))]
        + [_format_value(r.get(k), _COLUMN_SPEC[k][1]) for k in keys]
        for r in rows
    ]
    return header, body


def format_summary_table(rows: list[dict], columns: Sequence[str] = TERMINAL_COLUMNS) -> str:
    """A fixed-width plain-text table for a terminal; text left-aligned, numbers right-aligned."""
    if not rows:
        return "(no eval results)"
    header, body = _table_cells(rows, _present_columns(rows, columns))
    widths = [max(len(line[i]) for line in [header, *body]) for i in range(len(header))]

    def line(cells: list[str]) -> str:
        return "  ".join(
            c.ljust(w) if i < 2 else c.rjust(w)
            for i, (c, w) in enumerate(zip(cells, widths, strict=True))
        ).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(header), rule, *(line(r) for r in body)])


def _headline(rows: list[dict]) -> str | None:
    """One line comparing code and text eval accuracy at the latest phase both have."""
    acc = {(r["variant"], r["phase"]): r["accuracy"] for r in rows if r["accuracy"] is not None}
    for phase in reversed(list(dict.fromkeys(p for _, p in acc))):  # summary_rows order
        if ("code", phase) in acc and ("text", phase) in acc:
            code, text = acc["code", phase], acc["text", phase]
            return (
                f"Eval accuracy after {phase}: code {code:.3f} vs text {text:.3f} "
                f"({code - text:+.3f})."
            )
    return None


_TRAINING_COLUMNS = (
    ("steps", "steps", "d"),
    ("last_loss", "last loss", ".4f"),
    ("reward_last10", "reward (last 10)", ".3f"),
    ("train_s", "train s", ".1f"),
)


def _training_rows(records: list[dict]) -> list[dict]:
    """Per (variant, phase): step count, last loss, mean reward of the last 10 steps, total time."""
    rows = []
    for variant in _variants(records):
        phases = _ordered({r["phase"] for r in records if r["variant"] == variant}, PHASE_ORDER)
        for phase in phases:
            mine = [r for r in records if r["variant"] == variant and r["phase"] == phase]
            _, loss = _series(records, variant, phase, "train/loss")
            _, reward = _series(records, variant, phase, "train/reward_mean")
            _, times = _series(records, variant, phase, "time/step_s")
            rows.append(
                {
                    "variant": variant,
                    "phase": phase,
                    "steps": float(len(mine)),
                    "last_loss": loss[-1] if loss else None,
                    "reward_last10": sum(reward[-10:]) / len(reward[-10:]) if reward else None,
                    "train_s": sum(times) if times else None,
                }
            )
    return rows


# ---------------------------------------------------------------------------- plots


def _colour(variant: str, variants: list[str]) -> str:
    if variant in _VARIANT_COLOURS:
        return _VARIANT_COLOURS[variant]
    extras = [v for v in variants if v not in _VARIANT_COLOURS]
    return _EXTRA_COLOURS[extras.index(variant) % len(_EXTRA_COLOURS)]


def _smooth(values: list[float], window: int) -> list[float]:
    """Trailing mean over `window` points (the first points average over what exists)."""
    out, total = [], 0.0
    for i, v in enumerate(values):
        total += v
        if i >= window:
            total -= values[i - window]
        out.append(total / min(i + 1, window))
    return out


def _budget_changes(records: list[dict], variants: list[str]) -> list[tuple[float, float]]:
    """(step, budget) where the RL interaction budget takes a new value (CIR's 2 -> 3 -> 4)."""
    for variant in variants:
        steps, budgets = _series(records, variant, "rl", "rl/budget")
        if budgets:
            changes = [(steps[0], budgets[0])]
            for s, b in zip(steps[1:], budgets[1:], strict=True):
                if b != changes[-1][1]:
                    changes.append((s, b))
            return changes
    return []


def _draw_panel(ax, records, variants, phase, key, ylabel, budgets) -> bool:
    drawn = False
    for variant in variants:
        steps, values = _series(records, variant, phase, key)
        if not values:
            continue
        colour = _colour(variant, variants)
        if len(values) >= 20:
            # Raw per-step values are noisy at RL batch sizes: show them faint under a smoothed line.
            ax.plot(steps, values, color=colour, alpha=0.25, linewidth=1)
            ax.plot(
                steps,
                _smooth(values, max(2, len(values) // 15)),
                color=colour,
                linewidth=2,
                label=variant,
            )
        else:
            # Few points (or one): markers keep a single step visible.
            ax.plot(
                steps, values, color=colour, linewidth=1.8, marker="o", markersize=4, label=variant
            )
        drawn = True
    if not drawn:
        return False
    if budgets:
        ax.margins(y=0.15)  # room at the top for the stage labels
    for i, (step, budget) in enumerate(budgets):
        if i > 0:
            ax.axvline(step, color="0.55", linestyle=":", linewidth=1)
        ax.annotate(
            f"budget {budget:g}",
            xy=(step, 1.0),
            xycoords=("data", "axes fraction"),
            xytext=(3, -12),
            textcoords="offset points",
            fontsize=8,
            color="0.4",
        )
    ax.set_xlabel(f"{phase.upper()} step")
    ax.set_ylabel(ylabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    lo, hi = ax.get_xlim()
    if hi - lo < 2:  # one or two steps: widen so the integer ticks are not fractions of a step
        ax.set_xlim((lo + hi) / 2 - 1, (lo + hi) / 2 + 1)
    ax.grid(True, alpha=0.3)
    ax.legend(frameon=False, fontsize=9)
    return True


# (file stem, figure title, phase, [(metric key, y label)], mark budget stages)
_FIGURES = (
    (
        "rl_reward_accuracy",
        "RL: reward and training accuracy",
        "rl",
        [("train/reward_mean", "reward (mean)"), ("train/accuracy", "training accuracy")],
        False,
    ),
    ("sft_loss", "SFT loss", "sft", [("train/loss", "loss")], False),
    (
        "response_length",
        "RL: response length in model tokens",
        "rl",
        [("length/model_tokens_mean", "model tokens / trajectory")],
        True,
    ),
    (
        "tool_calls",
        "RL: tool calls per trajectory",
        "rl",
        [("tools/calls_mean", "calls / trajectory")],
        True,
    ),
    (
        "code_pass_rate",
        "RL: code pass rate (share of calls that ran OK)",
        "rl",
        [("tools/ok_share", "tools/ok_share")],
        True,
    ),
    (
        "rl_health",
        "RL: optimisation health",
        "rl",
        [
            ("actor/clip_frac", "clip fraction"),
            ("actor/grad_norm", "grad norm"),
            ("train/truncation_rate", "truncation rate"),
        ],
        False,
    ),
    (
        "rl_entropy_kl",
        "RL: policy entropy and KL",
        "rl",
        [("actor/entropy", "entropy (model tokens)"), ("actor/approx_kl", "KL to old policy")],
        False,
    ),
)


def _new_figure(n_panels: int) -> tuple[Figure, list]:
    fig = figure((4.8 * n_panels + 1.2, 3.6), layout="constrained")
    axes = fig.subplots(1, n_panels, squeeze=False)[0]
    return fig, list(axes)


def _eval_accuracy_figure(rows: list[dict], path: Path) -> bool:
    """Grouped bars: eval accuracy per phase, one bar per variant, values written on the bars."""
    rows = [r for r in rows if r["accuracy"] is not None]
    if not rows:
        return False
    variants = _ordered({r["variant"] for r in rows}, VARIANT_ORDER)
    phases = list(dict.fromkeys(r["phase"] for r in rows))  # summary_rows' order
    acc = {(r["variant"], r["phase"]): r["accuracy"] for r in rows}
    fig, (ax,) = _new_figure(1)
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        xs = [
            j + (i - (len(variants) - 1) / 2) * width
            for j, p in enumerate(phases)
            if (variant, p) in acc
        ]
        ys = [acc[variant, p] for p in phases if (variant, p) in acc]
        bars = ax.bar(xs, ys, width * 0.95, color=_colour(variant, variants), label=variant)
        ax.bar_label(bars, fmt="%.3f", fontsize=8, padding=2)
    ax.set_xticks(range(len(phases)), phases)
    # Headroom above 1.0 keeps the value labels and the legend clear of the bars.
    ax.set_ylim(0, max(1.0, max(acc.values())) * 1.3)
    if max(acc.values()) <= 1.0:
        ax.set_yticks([0, 0.2, 0.4, 0.6, 0.8, 1.0])
    ax.set_ylabel("eval accuracy")
    ax.set_title("Eval accuracy by phase")
    ax.grid(True, axis="y", alpha=0.3)
    ax.legend(frameon=False, fontsize=9, loc="upper center", ncol=min(len(variants), 4))
    save_png(fig, path, dpi=110)
    return True


CURRICULUM_KEY = re.compile(r"curriculum/(.+)/(pass_rate|share)")


def _curriculum_figure(records: list[dict], path: Path) -> bool:
    """The curriculum's buckets over RL (`rl.curriculum`): per variant, each bucket's pass rate
    and its share of the tasks drawn, one line per bucket; False when no record has them."""
    rl = [r for r in records if r.get("phase") == "rl"]
    keys = sorted({k for r in rl for k in r if CURRICULUM_KEY.fullmatch(k)})
    variants = [
        v for v in _variants(rl) if any(k in r for r in rl if r["variant"] == v for k in keys)
    ]
    if not keys or not variants:
        return False
    buckets = sorted({CURRICULUM_KEY.fullmatch(k).group(1) for k in keys})
    fig, axes = _new_figure(2 * len(variants))
    for i, variant in enumerate(variants):
        for ax, what, label in zip(
            axes[2 * i : 2 * i + 2], ("pass_rate", "share"), ("group pass rate", "share drawn")
        ):
            for bucket in buckets:
                steps, values = _series(rl, variant, "rl", f"curriculum/{bucket}/{what}")
                if values:
                    ax.plot(steps, values, label=bucket, linewidth=1.2)
            ax.set_title(f"{variant}: {label} by bucket", fontsize=10)
            ax.set_xlabel("RL step")
            ax.set_ylim(-0.05, 1.05)
            ax.grid(True, alpha=0.3)
        axes[2 * i].legend(frameon=False, fontsize=7, ncol=2)
    fig.suptitle("Curriculum buckets")
    save_png(fig, path, dpi=110)
    return True


def write_plots(records: list[dict], eval_results: dict, plots_dir: Path) -> list[tuple[str, Path]]:
    """Write every figure that has data; returns [(title, png path)] in display order."""
    plots_dir = Path(plots_dir)
    plots_dir.mkdir(parents=True, exist_ok=True)
    written = []
    path = plots_dir / "eval_accuracy.png"
    if _eval_accuracy_figure(summary_rows(eval_results), path):
        written.append(("Eval accuracy by phase", path))

    variants = _variants(records)
    budgets = _budget_changes(records, variants)
    for stem, title, phase, panels, mark_budget in _FIGURES:
        panels = [
            (key, ylabel)
            for key, ylabel in panels
            if any(_series(records, v, phase, key)[1] for v in variants)
        ]
        if not panels:
            continue
        fig, axes = _new_figure(len(panels))
        for ax, (key, ylabel) in zip(axes, panels, strict=True):
            _draw_panel(ax, records, variants, phase, key, ylabel, budgets if mark_budget else [])
        fig.suptitle(title)
        path = plots_dir / f"{stem}.png"
        save_png(fig, path, dpi=110)
        written.append((title, path))
    path = plots_dir / "curriculum.png"
    if _curriculum_figure(records, path):
        written.append(("Curriculum buckets", path))
    return written


# ---------------------------------------------------------------------------- samples


def _pick_samples(samples: Iterable, max_samples: int) -> list[Trajectory]:
    """Round-robin over variants, alternating correct and incorrect within each, so a short list
    still shows both variants and both outcomes."""
    by_variant: dict[str, list[Trajectory]] = {}
    for s in samples:
        traj = s if isinstance(s, Trajectory) else Trajectory.from_dict(s)
        by_variant.setdefault(str(traj.meta.get("variant", "?")), []).append(traj)
    queues = []
    for variant in _ordered(by_variant, VARIANT_ORDER):
        good = [t for t in by_variant[variant] if t.correct]
        bad = [t for t in by_variant[variant] if not t.correct]
        queue = [t for pair in zip(good, bad, strict=False) for t in pair]
        queue += good[len(bad) :] + bad[len(good) :]
        queues.append(queue)
    picked = []
    for i in range(max((len(q) for q in queues), default=0)):
        picked += [q[i] for q in queues if i < len(q)]
    return picked[:max_samples]


def _sample_facts(traj: Trajectory) -> list[str]:
    meta = traj.meta
    facts = [
        f"gold: {meta.get('gold', '-')}",
        f"predicted: {traj.score.predicted if traj.score is not None else '-'}",
        f"finish: {traj.finish_reason}",
        f"model tokens: {traj.num_model_tokens}",
        f"tool tokens: {traj.num_tool_tokens}",
    ]
    if traj.tool_calls:
        facts.append("tool calls: " + ", ".join(c.status for c in traj.tool_calls))
    return facts


def _segment_text(seg) -> str:
    return seg.text if seg.text else f"[{len(seg.ids)} tokens, no text]"


# ---------------------------------------------------------------------------- markdown


def _align(header: list[str]) -> str:
    """Every table here: two text columns (variant and phase, or their like), then numbers."""
    return "<<" + ">" * (len(header) - 2)


def _md_table(header: list[str], body: list[list[str]]) -> str:
    return md_table(header, body, _align(header))


def _fence(text: str) -> str:
    """A code fence longer than any backtick run inside, so ```python blocks nest safely."""
    longest = max((len(m) for m in re.findall(r"`+", text)), default=0)
    return "`" * max(3, longest + 1)


def _training_table_cells(rows: list[dict]) -> tuple[list[str], list[list[str]]]:
    keys = [c for c in _TRAINING_COLUMNS if any(r[c[0]] is not None for r in rows)]
    header = ["variant", "phase"] + [h for _, h, _ in keys]
    body = [[r["variant"], r["phase"]] + [_format_value(r[k], f) for k, _, f in keys] for r in rows]
    return header, body


GAINS_NOTE = (
    "Held-out items scored after SFT and after RL, paired by item: the gain is the mean of the"
    " per-item differences, with a 95 % bootstrap CI over items (rl_gains.json)."
)


OTHER_GAINS_NOTE = (
    "The same held-out items, paired: what SFT added to the model as loaded (eval.base), and"
    " the code variant against the text-only one (other_gains.json)."
)


def _markdown(title, rows, training, plots, picked, config, run_dir, gains=(), extra=()) -> str:
    """`extra`: (notes, other comparisons, the caller's tables)."""
    notes, others, tables = extra or ((), (), ())
    out = [f"# {title}", ""]
    headline = _headline(rows)
    if headline:
        out += [f"**{headline}**", ""]
    if notes:
        out += ["## Warnings", "", *(f"- {n}" for n in notes), ""]
    for heading, note, header, body in tables:
        out += [f"## {heading}", "", *([note, ""] if note else []), _md_table(header, body), ""]
    out += ["## Evaluation", ""]
    if rows:
        out += [_md_table(*_table_cells(rows, _present_columns(rows, _COLUMN_SPEC))), ""]
    else:
        out += ["No eval results.", ""]
    if training:
        out += ["## Training", "", _md_table(*_training_table_cells(training)), ""]
    if gains:
        out += [
            "## RL against its SFT start",
            "",
            GAINS_NOTE,
            "",
            _md_table(*gains_cells(gains)),
            "",
        ]
    if others:
        out += ["## Paired comparisons", "", OTHER_GAINS_NOTE, "",
                _md_table(*comparison_cells(others)), ""]  # fmt: skip
    out += ["## Plots", ""]
    if plots:
        for name, path in plots:
            out += [f"### {name}", "", f"![{name}]({path.relative_to(run_dir).as_posix()})", ""]
    else:
        out += ["No metrics were logged, so there is nothing to plot.", ""]
    if picked:
        out += ["## Sample trajectories", ""]
        for i, traj in enumerate(picked, start=1):
            response = traj.response_text or "".join(
                _segment_text(s) for s in traj.response_segments
            )
            fence = _fence(response)
            question = str(traj.meta.get("question", "")).strip() or "(no question recorded)"
            out += [
                f"### {i}. {traj.meta.get('variant', '?')} · {viewer.verdict(traj)}",
                "",
                *(f"> {line}" for line in question.splitlines()),
                "",
                " · ".join(_sample_facts(traj)),
                "",
                f"{fence}text",
                response,
                fence,
                "",
            ]
    if config:
        body = json.dumps(config, indent=2, default=str)
        out += ["## Config", "", f"{_fence(body)}json", body, _fence(body), ""]
    return "\n".join(out)


# ---------------------------------------------------------------------------- html


def _html_table(header: list[str], body: list[list[str]]) -> str:
    return html_table(header, body, _align(header))


def _html(title, rows, training, plots, picked, config, tokenizer=None, gains=(), extra=()) -> str:
    notes, others, tables = extra or ((), (), ())
    out = [element("h1", title)]
    headline = _headline(rows)
    if headline:
        out.append(element("p", headline, cls="headline"))
    if notes:
        items = "".join(element("li", n) for n in notes)
        out.append(f'<h2>Warnings</h2><ul class="warnings">{items}</ul>')
    for heading, note, header, body in tables:
        out += [element("h2", heading), *([element("p", note)] if note else []),
                _html_table(header, body)]  # fmt: skip
    out.append("<h2>Evaluation</h2>")
    if rows:
        out.append(_html_table(*_table_cells(rows, _present_columns(rows, _COLUMN_SPEC))))
    else:
        out.append("<p>No eval results.</p>")
    if training:
        out += ["<h2>Training</h2>", _html_table(*_training_table_cells(training))]
    if gains:
        out += ["<h2>RL against its SFT start</h2>", element("p", GAINS_NOTE),
                _html_table(*gains_cells(gains))]  # fmt: skip
    if others:
        out += ["<h2>Paired comparisons</h2>", element("p", OTHER_GAINS_NOTE),
                _html_table(*comparison_cells(others))]  # fmt: skip
    out.append("<h2>Plots</h2>")
    if not plots:
        out.append("<p>No metrics were logged, so there is nothing to plot.</p>")
    out += [figure_html(path, name) for name, path in plots]
    if picked:
        out += ["<h2>Sample trajectories</h2>", viewer.controls_html(picked)]
        out += [viewer.trajectory_html(i, t, tokenizer) for i, t in enumerate(picked, start=1)]
    if config:
        body = element("pre", json.dumps(config, indent=2, default=str))
        out.append(f"<h2>Config</h2><details><summary>config</summary>{body}</details>")
    script = viewer.VIEWER_JS if picked else ""
    return html_page(title, out, css=viewer.VIEWER_CSS, script=script)


# ---------------------------------------------------------------------------- entry point


def write_report(
    run_dir: Path,
    *,
    eval_results: dict,
    metrics_path: Path,
    samples: Sequence[Trajectory | dict] = (),
    title: str = "tirl train",
    config: dict | None = None,
    max_samples: int = 6,
    tokenizer=None,
    tables: Sequence[tuple[str, str, list[str], list[list[str]]]] = (),
) -> dict[str, Path]:
    """Write `run_dir/plots/*.png`, `run_dir/report.md` and `run_dir/report.html`.

    `tables`: a caller's own results, each (title, note, header, rows), shown first (an
    ablation's comparison and verdicts).

    `samples` may be Trajectory objects or `Trajectory.to_dict()` dicts; at most `max_samples`
    are shown, mixing variants and correct/wrong answers. With `tokenizer` (the one that made
    the ids) the HTML shows every token as its own element. Returns
    {"markdown": path, "html": path, "plots": plots folder}.
    """
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    records = read_metrics(metrics_path)
    eval_results = eval_results or {}
    plots_dir = run_dir / "plots"
    plots = write_plots(records, eval_results, plots_dir)
    rows = summary_rows(eval_results)
    training = _training_rows(records)
    picked = _pick_samples(samples, max_samples)
    gains = rl_gains(run_dir)
    if gains:
        write_text(run_dir / "rl_gains.json", json_text(gains))
    others = other_gains(run_dir)
    if others:
        write_text(run_dir / "other_gains.json", json_text(others))
    extra = (rl_signal_notes(records), others, tables)

    md_path = run_dir / "report.md"
    md_path.write_text(
        _markdown(title, rows, training, plots, picked, config, run_dir, gains, extra),
        encoding="utf-8",
    )
    html_path = run_dir / "report.html"
    html_path.write_text(
        _html(title, rows, training, plots, picked, config, tokenizer, gains, extra),
        encoding="utf-8",
    )
    return {"markdown": md_path, "html": html_path, "plots": plots_dir}
