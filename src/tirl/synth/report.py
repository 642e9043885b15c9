"""Per-stage statistics of a synth run, as `report.md` and `report.html`.

Everything is computed from the run folder (stage files, request caches, config.yaml), so
`tirl synth report DIR` gives the same tables as the run itself, and an interrupted run can be
inspected. For every stage: items in, kept, rejected, and the rejections by reason
(in = kept + rejected by construction: one line per item); stage notes (outputs replaced,
trajectories corrected, blocks judged) are summed. Then the teacher and judge usage: answered
requests, tokens from `usage`, and cost from the configured per-1k prices.
"""

from __future__ import annotations

import html
import json
from collections import Counter
from pathlib import Path

import yaml

from tirl.synth.config import STAGE_NAMES
from tirl.synth.stagelog import StageLog


def stage_stats(out: Path) -> list[dict]:
    stats = []
    for path in sorted((out / "stages").glob("*.jsonl")):
        rows = StageLog(path).rows.values()
        reasons = Counter(r["reason"] for r in rows if not r["kept"])
        notes: Counter = Counter()
        for r in rows:
            notes.update(r.get("notes") or {})
        stats.append(
            {
                "stage": path.stem.split("_", 1)[1],
                "in": len(rows),
                "out": sum(r["kept"] for r in rows),
                "rejected": sum(reasons.values()),
                "reasons": dict(reasons.most_common()),
                "notes": dict(notes),
            }
        )
    return stats


def usage_stats(out: Path, config: dict) -> list[dict]:
    rows = []
    for role in ("teacher", "judge"):
        path = out / "cache" / f"{role}.jsonl"
        if not path.exists():
            continue
        entries = {}
        for line in path.read_text().splitlines():
            try:
                entry = json.loads(line)
            except json.JSONDecodeError:
                continue
            entries[entry["key"]] = entry.get("usage") or {}
        prompt = sum(int(u.get("prompt_tokens") or 0) for u in entries.values())
        completion = sum(int(u.get("completion_tokens") or 0) for u in entries.values())
        endpoint = config.get(role) or config.get("teacher") or {}
        cost = (
            prompt * endpoint.get("price_prompt_per_1k", 0.0)
            + completion * endpoint.get("price_completion_per_1k", 0.0)
        ) / 1000
        rows.append(
            {
                "role": role,
                "requests": len(entries),
                "prompt_tokens": prompt,
                "completion_tokens": completion,
                "cost": round(cost, 6),
            }
        )
    return rows


def _reasons(s: dict) -> str:
    return "; ".join(f"{r}: {n}" for r, n in s["reasons"].items()) or "-"


def _notes(s: dict) -> str:
    return "; ".join(f"{k}: {v}" for k, v in s["notes"].items()) or "-"


def render_markdown(stages: list[dict], usage: list[dict], title: str) -> str:
    lines = [f"# {title}", "", "## Stages", ""]
    lines += ["| stage | in | out | rejected | rejections by reason | notes |"]
    lines += ["|---|---:|---:|---:|---|---|"]
    for s in stages:
        lines.append(
            f"| {s['stage']} | {s['in']} | {s['out']} | {s['rejected']} | {_reasons(s)} | {_notes(s)} |"
        )
    if usage:
        lines += [
            "",
            "## Requests",
            "",
            "| endpoint | requests | prompt tokens | completion tokens | cost |",
        ]
        lines += ["|---|---:|---:|---:|---:|"]
        for u in usage:
            lines.append(
                f"| {u['role']} | {u['requests']} | {u['prompt_tokens']} |"
                f" {u['completion_tokens']} | {u['cost']:g} |"
            )
    return "\n".join(lines) + "\n"


def render_html(stages: list[dict], usage: list[dict], title: str) -> str:
    def table(head: list[str], rows: list[list]) -> str:
        th = "".join(f"<th>{html.escape(h)}</th>" for h in head)
        body = "".join(
            "<tr>" + "".join(f"<td>{html.escape(str(c))}</td>" for c in row) + "</tr>"
            for row in rows
        )
        return f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>"

    stage_rows = [
        [s["stage"], s["in"], s["out"], s["rejected"], _reasons(s), _notes(s)] for s in stages
    ]
    usage_rows = [
        [u["role"], u["requests"], u["prompt_tokens"], u["completion_tokens"], f"{u['cost']:g}"]
        for u in usage
    ]
    style = "table{border-collapse:collapse}td,th{border:1px solid #999;padding:2px 8px}"
    return (
        f"<!doctype html><html><head><meta charset='utf-8'><title>{html.escape(title)}</title>"
        f"<style>{style}</style></head><body><h1>{html.escape(title)}</h1><h2>Stages</h2>"
        + table(["stage", "in", "out", "rejected", "rejections by reason", "notes"], stage_rows)
        + "<h2>Requests</h2>"
        + table(["endpoint", "requests", "prompt tokens", "completion tokens", "cost"], usage_rows)
        + "</body></html>\n"
    )


def write_report(out: str | Path, title: str | None = None) -> list[Path]:
    out = Path(out)
    config_path = out / "config.yaml"
    config = yaml.safe_load(config_path.read_text()) if config_path.exists() else {}
    stages = stage_stats(out)
    # Stage files sort by number already; keep any unknown names last (a newer pipeline's).
    stages.sort(key=lambda s: (["read", *STAGE_NAMES] + [s["stage"]]).index(s["stage"]))
    usage = usage_stats(out, config or {})
    title = title or f"tirl synth: {out}"
    (out / "stats.json").write_text(json.dumps({"stages": stages, "usage": usage}, indent=2))
    md, page = out / "report.md", out / "report.html"
    md.write_text(render_markdown(stages, usage, title))
    page.write_text(render_html(stages, usage, title))
    return [md, page]
