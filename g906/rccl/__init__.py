"""`g906 rccl`: a transactional swap of torch's bundled librccl for a gfx906 build.

Public API (the CLI and `g906 up` use these; none imports torch):

    resolve_target(python=None, lib_dir=None) -> Target
    install(source, target, *, force, dry_run, probe, probe_backend, probe_world_size, ...) -> InstallResult
    rollback(target, *, force, dry_run) -> RollbackResult
    status(target) -> dict
    run_probe(python, *, world_size, backend, timeout) -> ProbeResult
    ensure_rccl_for_plan(plan, facts, *, assume_yes, dry_run, interactive) -> RcclDecision
"""

from g906.rccl.faults import ALL_STEPS, FAULT_ENV, INSTALL_STEPS, ROLLBACK_STEPS
from g906.rccl.integration import RcclDecision, ensure_rccl_for_plan
from g906.rccl.libinfo import LibraryInfo, inspect_library
from g906.rccl.probe import ProbeResult, run_probe
from g906.rccl.state import STATE_ENV, state_root
from g906.rccl.target import Target, resolve_target
from g906.rccl.transaction import InstallResult, ProbeFailed, RollbackResult, install, rollback, status

__all__ = [
    "ALL_STEPS", "FAULT_ENV", "INSTALL_STEPS", "ROLLBACK_STEPS", "STATE_ENV",
    "InstallResult", "LibraryInfo", "ProbeFailed", "ProbeResult", "RcclDecision", "RollbackResult", "Target",
    "ensure_rccl_for_plan", "inspect_library", "install", "resolve_target", "rollback", "run_probe",
    "state_root", "status",
]
