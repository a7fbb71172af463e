"""`g906 doctor`: facts about the machine, a registry of checks, rendering, preflight for `g906 up`.

    from g906.doctor import collect_facts, run_checks, preflight, blocking, estimate_memory
    facts = collect_facts()                      # or Facts.load("facts.json")
    findings = run_checks(facts, plan=None)      # list[Finding(id, status, summary, detail, fix)]

Nothing here imports torch: torch/triton are inspected in a subprocess (probe.py).
"""

from g906.doctor.checks import Finding, all_checks, exit_code, run_checks, summarize
from g906.doctor.facts import Facts, collect_facts
from g906.doctor.memory import MemoryEstimate, estimate_memory, resolve_dtype
from g906.doctor.preflight import blocking, preflight, preflight_error, preflight_facts

__all__ = [
    "Facts", "Finding", "MemoryEstimate", "all_checks", "blocking", "collect_facts", "estimate_memory",
    "exit_code", "preflight", "preflight_error", "preflight_facts", "resolve_dtype", "run_checks", "summarize",
]
