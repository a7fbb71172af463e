"""Preflight for `g906 up`: collect the facts and run the checks that matter for one plan."""

from __future__ import annotations

import sys
from typing import Any

from g906.doctor.checks import Finding, run_checks
from g906.doctor.facts import Facts, collect_facts


def preflight(plan: Any, *, facts: Facts | None = None, python: str | None = None,
              timeout_s: float = 60.0) -> list[Finding]:
    """Findings for `plan`; blocking(findings) tells whether `g906 up` must stop.

    The inspected interpreter is this one for the embedded engine, and engine.vllm.python for
    a vLLM handoff (when set). Pass `facts` to evaluate recorded facts instead of collecting."""
    if facts is None:
        if python is None and getattr(plan, "engine_kind", "embedded") == "vllm":
            python = plan.recipe.engine.vllm.python or None
        facts = collect_facts(python=python or sys.executable, timeout_s=timeout_s)
    return run_checks(facts, plan, preflight_only=True)


def blocking(findings: list[Finding]) -> list[Finding]:
    """The findings that stop `g906 up` (every fail)."""
    return [f for f in findings if f.status == "fail"]
