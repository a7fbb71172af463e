"""Preflight for `g906 up`: collect the facts and run the checks that matter for one plan.

    facts = preflight_facts(plan)                 # also what ensure_rccl_for_plan(plan, facts) reads
    findings = preflight(plan, facts=facts)
    err = preflight_error(findings)
    if err is not None:
        raise err                                 # G906Error: exit 1, "Error: ... / Hint: ..."
"""

from __future__ import annotations

import sys
from typing import Any

from g906.doctor.checks import Finding, run_checks
from g906.doctor.facts import Facts, collect_facts
from g906.errors import G906Error


def preflight_facts(plan: Any, *, python: str | None = None, timeout_s: float = 60.0) -> Facts:
    """The facts for `plan`: the inspected interpreter is this one for the embedded engine, and
    engine.vllm.python for a vLLM handoff (when set)."""
    if python is None and getattr(plan, "engine_kind", "embedded") == "vllm":
        python = plan.recipe.engine.vllm.python or None
    return collect_facts(python=python or sys.executable, timeout_s=timeout_s)


def preflight(plan: Any, *, facts: Facts | None = None, python: str | None = None,
              timeout_s: float = 60.0) -> list[Finding]:
    """Findings for `plan` (recipe checks included, --deep ones not); blocking(findings) tells
    whether `g906 up` must stop. Pass `facts` to evaluate recorded facts instead of collecting."""
    if facts is None:
        facts = preflight_facts(plan, python=python, timeout_s=timeout_s)
    return run_checks(facts, plan, preflight_only=True)


def blocking(findings: list[Finding]) -> list[Finding]:
    """The findings that stop `g906 up` (every fail)."""
    return [f for f in findings if f.status == "fail"]


def preflight_error(findings: list[Finding]) -> G906Error | None:
    """A G906Error naming each blocking finding and its fix, or None when nothing blocks."""
    bad = blocking(findings)
    if not bad:
        return None
    details = [f"  ✗ {f.id}: {f.summary}" + (f"\n    fix: {f.fix}" if f.fix else "") for f in bad]
    return G906Error(
        f"the doctor found {len(bad)} problem(s) that stop this recipe",
        hint="fix them and run again (details: g906 doctor --recipe RECIPE -v; skip with --skip-doctor)",
        details=details,
    )
