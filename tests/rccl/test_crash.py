"""A SIGKILL at every named step of install and rollback, then a re-run.

For each step: the killed command really died by SIGKILL at that step; every destination holds
one complete library (the original or the new one), symlinks are intact, the backup named by
the manifest verifies; and re-running install or rollback finishes the job."""

from __future__ import annotations

import os
import signal

import pytest

from g906.errors import G906Error
from g906.rccl import INSTALL_STEPS, ROLLBACK_STEPS, install, resolve_target, rollback, status
from g906.rccl import state as st
from g906.rccl.stash import verify_backup

from .helpers import run_cli, sha

PRE_MANIFEST = {"install_locked", "backup_partial", "backup_done"}
DONE = {"recorded", "probe_started"}


def check_invariants(env, before: dict[str, str], new_sha: str) -> st.Manifest | None:
    now = env.files()
    temps = [n for n in now if n.startswith(".")]
    assert all(n.startswith(".librccl") and n.endswith((".g906-new", ".g906-restore")) for n in temps), temps
    now = {k: v for k, v in now.items() if k not in temps}     # g906's hidden temporaries: never loaded
    assert set(now) == set(before), f"entries changed: {sorted(now)} vs {sorted(before)}"
    for name, value in before.items():
        if value.startswith("->"):
            assert now[name] == value, f"symlink {name} changed"
        elif name.startswith("librccl"):
            assert now[name] in (value, new_sha), f"{name} holds neither the original nor the new library"
        else:
            assert now[name] == value
    area = st.area_for(env.lib_dir)
    m = st.load_manifest(area)            # never damaged by a kill
    if m is None:
        assert now == before, "target changed without a manifest"
    else:
        verify_backup(area, m)
        orig = m.original_by_name()
        assert orig["librccl.so.1"].sha256 == before["librccl.so.1"]
    return m


def killed(proc) -> None:
    assert proc.returncode == -signal.SIGKILL, f"expected SIGKILL, got {proc.returncode}\n{proc.stdout}\n{proc.stderr}"


@pytest.mark.parametrize("rerun", ["install", "rollback"])
@pytest.mark.parametrize("step", INSTALL_STEPS)
def test_kill_during_install(step, rerun, fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    new_sha = sha(gfx906_lib)
    probe = ["--probe-backend", "gloo"] if step == "probe_started" else ["--no-probe"]
    proc = run_cli("install", gfx906_lib, "--python", env.python, *probe, fault=step)
    killed(proc)
    m = check_invariants(env, before, new_sha)
    if step in PRE_MANIFEST:
        assert m is None
    t = resolve_target(str(env.python))
    if step in ("replaced", "verified"):
        assert env.files()["librccl.so.1"] == new_sha
    if step in ("staged", "manifest_written", "backup_done", "backup_partial", "install_locked"):
        assert env.files()["librccl.so.1"] == before["librccl.so.1"]
    if any(n.startswith(".") for n in os.listdir(env.lib_dir)):
        assert step == "staged"                      # the staged temporary; cleaned by the re-run

    if rerun == "install":
        if step in DONE:
            assert install(gfx906_lib, t, probe=False).action == "already_installed"
        else:
            res = install(gfx906_lib, t, probe=False)
            assert res.resumed == (step not in PRE_MANIFEST)
        assert env.files()["librccl.so.1"] == new_sha
        assert status(t)["g906_swap"]
        check_invariants(env, before, new_sha)
        rollback(t)
        assert env.files() == before
    else:
        if step in PRE_MANIFEST:
            with pytest.raises(G906Error, match="no g906 backup"):
                rollback(t)
        else:
            rollback(t)
        assert env.files() == before
    assert not [n for n in os.listdir(env.lib_dir) if n.startswith(".")]
    if rerun == "install":                      # a half-written backup of a killed run is tidied away
        backups = list((st.area_for(env.lib_dir) / "backup").iterdir())
        assert len(backups) == 1 and not list(backups[0].glob(".*.part"))


@pytest.mark.parametrize("rerun", ["rollback", "install"])
@pytest.mark.parametrize("step", ROLLBACK_STEPS)
def test_kill_during_rollback(step, rerun, fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    new_sha = sha(gfx906_lib)
    t = resolve_target(str(env.python))
    install(gfx906_lib, t, probe=False)
    proc = run_cli("rollback", "--python", env.python, fault=step)
    killed(proc)
    m = check_invariants(env, before, new_sha)
    assert m is not None
    if step in ("restored", "rollback_verified", "rollback_recorded"):
        assert env.files() == before
    if rerun == "rollback":
        res = rollback(t)
        assert res.action == ("already_rolled_back" if step in ("restored", "rollback_verified", "rollback_recorded")
                              else "rolled_back")
        assert env.files() == before
        assert st.load_manifest(st.area_for(env.lib_dir)).state == "rolled_back"
    else:
        if step == "rollback_locked":          # nothing happened yet: the swap is still complete
            assert install(gfx906_lib, t, probe=False).action == "already_installed"
        else:
            install(gfx906_lib, t, probe=False)
        assert env.files()["librccl.so.1"] == new_sha
        rollback(t)
        assert env.files() == before


@pytest.mark.parametrize("step", ROLLBACK_STEPS[1:])
def test_kill_during_automatic_rollback_after_failed_probe(step, fake_env, gfx906_lib):
    env = fake_env()                       # its torch fails to import: the probe fails
    before = env.files()
    proc = run_cli("install", gfx906_lib, "--python", env.python, "--probe-backend", "gloo", fault=step)
    killed(proc)
    check_invariants(env, before, sha(gfx906_lib))
    rollback(resolve_target(str(env.python)))
    assert env.files() == before

