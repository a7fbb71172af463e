"""Rendering of findings: grouped rich output with status glyphs and a summary line, or a stable
JSON document (--json)."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape

from g906.doctor.checks import GROUPS, Finding, summarize
from g906.doctor.facts import Facts

GLYPHS = {"ok": "✓", "warn": "!", "fail": "✗", "skip": "-"}
STYLES = {"ok": "green", "warn": "yellow", "fail": "bold red", "skip": "dim"}
JSON_FORMAT = 1


def engine_summary(findings: list[Finding]) -> dict[str, Any]:
    for f in findings:
        if f.id == "engine.device":
            return {"device": f.data.get("engine_device"), "dtype": f.data.get("dtype"), "summary": f.summary}
    return {}


def to_json(findings: list[Finding], facts: Facts, *, strict: bool = False, recipe: str | None = None,
            include_facts: bool = False) -> dict[str, Any]:
    from g906.doctor.checks import exit_code

    counts = summarize(findings)
    doc: dict[str, Any] = {
        "format": JSON_FORMAT,
        "ok": exit_code(findings, strict=strict) == 0,
        "summary": counts,
        "engine": engine_summary(findings),
        "recipe": recipe,
        "checks": [f.to_json() for f in findings],
    }
    if include_facts:
        doc["facts"] = facts.to_json()
    return doc


def summary_line(findings: list[Finding]) -> str:
    c = summarize(findings)
    parts = [f"{c['ok']} ok", f"{c['warn']} warning{'s' if c['warn'] != 1 else ''}",
             f"{c['fail']} failure{'s' if c['fail'] != 1 else ''}"]
    if c["skip"]:
        parts.append(f"{c['skip']} skipped")
    return ", ".join(parts)


def render(findings: list[Finding], facts: Facts, console: Console, *, verbose: bool = False,
           strict: bool = False) -> None:
    order = {g: i for i, g in enumerate(GROUPS)}
    groups: dict[str, list[Finding]] = {}
    for f in findings:
        groups.setdefault(f.group, []).append(f)
    for group in sorted(groups, key=lambda g: order.get(g, 99)):
        console.print(f"[bold]{escape(group)}[/]")
        for f in groups[group]:
            if f.status == "skip" and not verbose:
                continue
            style = STYLES[f.status]
            console.print(f"  [{style}]{GLYPHS[f.status]}[/] {escape(f.title)}: {escape(f.summary)}  [dim]{f.id}[/]",
                          soft_wrap=True)
            show_detail = verbose or f.status in ("warn", "fail") or f.id == "recipe.memory"
            if show_detail and f.detail:
                for line in f.detail.splitlines():
                    console.print(f"      [dim]{escape(line)}[/]", soft_wrap=True)
            if f.fix and f.status in ("warn", "fail"):
                console.print(f"      [bold]fix:[/] {escape(f.fix)}", soft_wrap=True)
        skipped = [f for f in groups[group] if f.status == "skip"]
        if skipped and not verbose and len(skipped) == len(groups[group]):
            console.print(f"  [dim]- {len(skipped)} check(s) not applicable (-v shows them)[/]")
    c = summarize(findings)
    style = "bold red" if c["fail"] else ("yellow" if c["warn"] else "green")
    verdict = "problems found" if c["fail"] else ("ready, with warnings" if c["warn"] else "ready")
    if strict and c["warn"] and not c["fail"]:
        verdict = "warnings (--strict)"
    eng = engine_summary(findings)
    console.print()
    if eng.get("summary"):
        console.print(f"[bold]Engine:[/] {escape(eng['summary'])}", soft_wrap=True)
    console.print(f"[{style}]{verdict}[/]: {summary_line(findings)}")


def render_list(specs, console: Console) -> None:
    order = {g: i for i, g in enumerate(GROUPS)}
    current = None
    for s in sorted(specs, key=lambda s: order.get(s.group, 99)):
        if s.group != current:
            current = s.group
            console.print(f"[bold]{escape(current)}[/]")
        extra = " (with --recipe)" if s.needs_plan else (" (with --deep)" if s.deep else "")
        console.print(f"  {s.id:<24} {escape(s.title)}[dim]{extra}[/]")
