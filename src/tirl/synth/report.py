"""Per-stage statistics of a synth run, as `report.md` and `report.html`.

Everything is computed from the run folder (stage files, request caches, config.yaml), so
`tirl synth report DIR` gives the same tables as the run itself, and an interrupted run can be
inspected. For every stage: items in, kept, rejected, and the rejections by reason
(in = kept + rejected by construction: one line per item); stage notes (outputs replaced,
trajectories corrected, blocks judged) are summed. Then the teacher and judge usage: answered
requests, tokens from `usage`, and cost from the configured per-1k prices.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import yaml

from tirl.report_kit import element, html_page, html_table, md_table
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


def _sections(stages: list[dict], usage: list[dict]) -> list[tuple[str, list, list, str]]:
    """(heading, header, rows, column alignment) of each table; no Requests without requests."""
    sections = [(
        "Stages",
        ["stage", "in", "out", "rejected", "rejections by reason", "notes"],
        [[s["stage"], s["in"], s["out"], s["rejected"], _reasons(s), _notes(s)] for s in stages],
        "->>>--",
    )]  # fmt: skip
    if usage:
        sections.append((
            "Requests",
            ["endpoint", "requests", "prompt tokens", "completion tokens", "cost"],
            [[u["role"], u["requests"], u["prompt_tokens"], u["completion_tokens"],
              f"{u['cost']:g}"] for u in usage],
            "->>>>",
        ))  # fmt: skip
    return sections


def render_markdown(stages: list[dict], usage: list[dict], title: str) -> str:
    lines = [f"# {title}"]
    for heading, header, rows, align in _sections(stages, usage):
        lines += ["", f"## {heading}", "", md_table(header, rows, align)]
    return "\n".join(lines) + "\n"


def render_html(stages: list[dict], usage: list[dict], title: str) -> str:
    body = [element("h1", title)]
    for heading, header, rows, align in _sections(stages, usage):
        body += [element("h2", heading), html_table(header, rows, align)]
    return html_page(title, body)


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
