"""Named steps of the install and rollback transactions, and the test-only fault hook.

Setting ``G906_RCCL_FAULT=<step>`` makes the process SIGKILL itself when it reaches that
step, so tests can prove that a kill anywhere leaves a recoverable state. The hook does
nothing unless that variable names the step being passed.
"""

from __future__ import annotations

import os
import signal

FAULT_ENV = "G906_RCCL_FAULT"

# Install: nothing in the target changes before "manifest_written"; from there on each
# destination holds either the complete original or the complete new library.
INSTALL_STEPS: tuple[str, ...] = (
    "install_locked",        # lock held, nothing written yet
    "backup_partial",        # first backup file copied to a temporary name, not yet renamed
    "backup_done",           # every original backed up; no manifest yet
    "manifest_written",      # manifest says "installing"; target untouched
    "staged",                # new library written and fsynced next to its destination
    "replaced",              # os.replace done (directory fsync not yet)
    "verified",              # target checksum verified; manifest still says "installing"
    "recorded",              # manifest says "installed"; probe not run yet
    "probe_started",         # probe processes about to start
)

# Rollback (also used by the automatic rollback after a failed probe).
ROLLBACK_STEPS: tuple[str, ...] = (
    "rollback_locked",       # lock held, nothing written yet
    "rollback_marked",       # manifest says "rolling_back"
    "restore_staged",        # original copied and fsynced next to its destination
    "restored",              # os.replace done
    "rollback_verified",     # original checksums verified; manifest still "rolling_back"
    "rollback_recorded",     # manifest says "rolled_back"
)

ALL_STEPS: tuple[str, ...] = INSTALL_STEPS + ROLLBACK_STEPS


def fault(step: str) -> None:
    """Kill this process with SIGKILL if G906_RCCL_FAULT names *step* (tests only)."""
    if step not in ALL_STEPS:  # a typo in the code is a bug, caught by the step tests
        raise ValueError(f"unknown rccl step {step!r}")
    if os.environ.get(FAULT_ENV) == step:
        os.kill(os.getpid(), signal.SIGKILL)
