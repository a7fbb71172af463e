"""install -> status -> rollback on fake torch environments, and every refusal."""

from __future__ import annotations

import json
import os
import stat

import pytest

from g906.errors import G906Error
from g906.rccl import install, resolve_target, rollback, status
from g906.rccl import state as st
from g906.rccl.lock import TargetLock
from g906.rccl.target import Target

from .helpers import HAVE_CC, assert_clean_error, run_cli, sha


def target_of(env) -> Target:
    return resolve_target(str(env.python))


def test_target_found_through_interpreter_without_importing_torch(fake_env):
    env = fake_env()  # its torch/__init__.py raises: finding it must not import it
    t = target_of(env)
    assert t.lib_dir == env.lib_dir
    assert t.torch_version == "2.9.1+rocm6.4"
    assert t.hip_version == "6.4.43482"


def test_install_status_rollback_restores_exact_bytes(fake_env, gfx906_lib, stock_lib, state_dir):
    env = fake_env()
    before = env.files()
    t = target_of(env)
    s0 = status(t)
    assert s0["has_gfx906"] is False and s0["g906_swap"] is False and s0["backup"] is None

    res = install(gfx906_lib, t, probe=False)
    assert res.action == "installed"
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)
    assert os.readlink(env.lib_dir / "librccl.so") == "librccl.so.1"     # symlink kept as a symlink
    assert (env.lib_dir / "libtorch_hip.so").read_bytes() == b"not touched"
    assert not [n for n in os.listdir(env.lib_dir) if n.startswith(".")]  # no temporaries left

    m = json.loads((st.area_for(env.lib_dir) / "manifest.json").read_text())
    assert m["state"] == "installed" and m["step"] == "recorded"
    assert m["torch_version"] == "2.9.1+rocm6.4" and m["lib_dir"] == str(env.lib_dir)
    rec = {r["name"]: r for r in m["original"]}
    assert rec["librccl.so.1"]["sha256"] == before["librccl.so.1"]
    assert rec["librccl.so"] == {**rec["librccl.so"], "kind": "symlink", "link": "librccl.so.1"}
    assert str(state_dir) in res.backup_dir

    s1 = status(t)
    assert s1["has_gfx906"] and s1["g906_swap"] and s1["backup"]["ok"] and s1["state"] == "installed"
    assert s1["active"]["rccl_version"].startswith("2.27.7")

    rb = rollback(t)
    assert rb.action == "rolled_back"
    assert env.files() == before
    s2 = status(t)
    assert s2["g906_swap"] is False and s2["state"] == "rolled_back" and not s2["has_gfx906"]

    again = rollback(t)                                  # idempotent
    assert again.action == "already_rolled_back"
    assert env.files() == before


def test_chain_layout_replaces_the_real_file_only(fake_env, gfx906_lib):
    env = fake_env(layout="chain")
    before = env.files()
    t = target_of(env)
    install(gfx906_lib, t, probe=False)
    assert os.readlink(env.lib_dir / "librccl.so.1") == "librccl.so.1.0"
    assert sha(env.lib_dir / "librccl.so.1.0") == sha(gfx906_lib)
    assert status(t)["has_gfx906"]
    rollback(t)
    assert env.files() == before


def test_mode_is_preserved_and_restored(fake_env, gfx906_lib):
    env = fake_env()
    os.chmod(env.lib_dir / "librccl.so.1", 0o644)
    t = target_of(env)
    install(gfx906_lib, t, probe=False)
    assert stat.S_IMODE(os.stat(env.lib_dir / "librccl.so.1").st_mode) == 0o644
    rollback(t)
    assert stat.S_IMODE(os.stat(env.lib_dir / "librccl.so.1").st_mode) == 0o644


def test_library_without_gfx906_is_refused_and_nothing_changes(fake_env, make_lib, state_dir):
    env = fake_env()
    before = env.files()
    other = make_lib("other", archs=("gfx90a",))
    with pytest.raises(G906Error, match="no gfx906 device code.*gfx90a"):
        install(other, target_of(env), probe=False)
    assert env.files() == before
    assert not (state_dir / "rccl").exists() or not any((state_dir / "rccl").rglob("manifest.json"))


def test_force_installs_without_gfx906_with_a_loud_warning(fake_env, make_lib):
    env = fake_env()
    other = make_lib("other", archs=("gfx90a",))
    lines = []
    res = install(other, target_of(env), probe=False, force=True, log=lines.append)
    assert any(w.startswith("WARNING") and "gfx906" in w for w in res.warnings)
    assert any(line.startswith("WARNING") for line in lines)
    assert sha(env.lib_dir / "librccl.so.1") == sha(other)


def test_identical_library_is_nothing_to_do(fake_env, gfx906_lib, stock_lib):
    env = fake_env()
    t = target_of(env)
    install(gfx906_lib, t, probe=False)
    before = env.files()
    res = install(gfx906_lib, t, probe=False)
    assert res.action == "already_installed" and "nothing to do" in res.notes[0]
    assert env.files() == before
    env2 = fake_env(gfx906_lib)                 # torch that already ships the same bytes
    assert install(gfx906_lib, target_of(env2), probe=False).action == "already_installed"


def test_upgrade_keeps_the_original_backup(fake_env, gfx906_lib, make_lib):
    env = fake_env()
    before = env.files()
    t = target_of(env)
    install(gfx906_lib, t, probe=False)
    newer = make_lib("g906-newer", archs=("gfx906",), version="2.28.1")
    res = install(newer, t, probe=False)
    assert sha(env.lib_dir / "librccl.so.1") == sha(newer)
    assert "librccl.so.1" in res.destinations
    rollback(t)
    assert env.files() == before                # the torch original, not the first swap


def test_dry_run_changes_nothing(fake_env, gfx906_lib, state_dir):
    env = fake_env()
    before = env.files()
    t = target_of(env)
    res = install(gfx906_lib, t, dry_run=True)
    assert res.action == "dry_run" and res.destinations == ["librccl.so.1"]
    assert any("would replace" in n for n in res.notes)
    assert env.files() == before
    assert not (state_dir / "rccl").exists() or not any((state_dir / "rccl").rglob("manifest.json"))
    install(gfx906_lib, t, probe=False)
    rb = rollback(t, dry_run=True)
    row = {r["name"]: r for r in rb.files}
    assert rb.action == "dry_run" and row["librccl.so.1"]["status"] == "g906" and row["librccl.so.1"]["action"] == "restore"
    assert row["librccl.so"]["action"] == "keep"
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)


def test_rollback_without_backup_is_refused(fake_env):
    env = fake_env()
    with pytest.raises(G906Error, match="no g906 backup"):
        rollback(target_of(env))


@pytest.mark.parametrize("damage", ["truncate", "edit", "garbage"])
def test_damaged_manifest_is_refused(fake_env, gfx906_lib, damage):
    env = fake_env()
    t = target_of(env)
    install(gfx906_lib, t, probe=False)
    mp = st.manifest_path(st.area_for(env.lib_dir))
    raw = mp.read_text()
    if damage == "truncate":
        mp.write_text(raw[: len(raw) // 2])
    elif damage == "edit":
        mp.write_text(raw.replace('"installed"', '"rolled_back"', 1))
    else:
        mp.write_bytes(b"\x00\xff not json")
    with pytest.raises(G906Error, match="manifest .* is damaged"):
        rollback(t)
    with pytest.raises(G906Error, match="manifest .* is damaged"):
        install(gfx906_lib, t, probe=False)
    assert status(t)["state"] == "damaged"
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)   # nothing touched


def test_damaged_backup_is_refused(fake_env, gfx906_lib):
    env = fake_env()
    t = target_of(env)
    res = install(gfx906_lib, t, probe=False)
    backup = os.path.join(res.backup_dir, "librccl.so.1")
    with open(backup, "r+b") as f:
        f.seek(100)
        f.write(b"XXXX")
    with pytest.raises(G906Error, match="backup of librccl.so.1 .* is damaged"):
        rollback(t)
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)
    assert status(t)["backup"]["ok"] is False


def test_file_changed_by_someone_else_is_detected(fake_env, gfx906_lib, make_lib):
    env = fake_env()
    original = env.files()["librccl.so.1"]
    t = target_of(env)
    install(gfx906_lib, t, probe=False)
    # torch reinstalled (new version, new library)
    reinstalled = make_lib("torch-2.10", archs=("gfx942",))
    (env.lib_dir / "librccl.so.1").write_bytes(reinstalled.read_bytes())
    (env.torch / "version.py").write_text("__version__ = '2.10.0+rocm7.0'\n")
    t = target_of(env)
    with pytest.raises(G906Error, match=r"matches neither .*torch was 2.9.1\+rocm6.4, now 2.10.0\+rocm7.0") as ei:
        rollback(t)
    assert "--force" in ei.value.hint
    assert sha(env.lib_dir / "librccl.so.1") == sha(reinstalled)
    assert any("changed since g906" in m for m in status(t)["messages"])

    rb = rollback(t, force=True)
    assert sha(env.lib_dir / "librccl.so.1") == original
    assert len(rb.displaced) == 1 and sha(rb.displaced[0]) == sha(reinstalled)   # nothing lost


def test_install_after_torch_reinstall_starts_a_new_transaction(fake_env, gfx906_lib, make_lib, state_dir):
    env = fake_env()
    t = target_of(env)
    first = install(gfx906_lib, t, probe=False)
    reinstalled = make_lib("torch-2.10", archs=("gfx942",))
    (env.lib_dir / "librccl.so.1").write_bytes(reinstalled.read_bytes())
    res = install(gfx906_lib, t, probe=False)
    assert any("changed since g906's last swap" in n for n in res.notes)
    assert res.backup_dir != first.backup_dir
    area = st.area_for(env.lib_dir)
    old_txn = os.path.basename(first.backup_dir)
    assert (area / "history" / old_txn / "manifest.json").is_file()
    assert (area / "history" / old_txn / "backup" / "librccl.so.1").is_file()      # earlier original kept
    rollback(t)
    assert sha(env.lib_dir / "librccl.so.1") == sha(reinstalled)                 # the current torch's own


def test_lock_held_by_another_process_is_refused(fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    area = st.area_for(env.lib_dir)
    with TargetLock(area, env.lib_dir):
        proc = run_cli("install", gfx906_lib, "--python", env.python, "--no-probe")
    assert_clean_error(proc, "another g906 rccl command", f"pid {os.getpid()}")
    assert env.files() == before


def test_torch_without_bundled_rccl_is_refused(fake_env, gfx906_lib):
    env = fake_env(layout="none")
    with pytest.raises(G906Error, match="holds no librccl"):
        install(gfx906_lib, target_of(env), probe=False)


def test_lib_dir_target(fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    t = resolve_target(None, env.lib_dir)
    assert t.torch_version == "2.9.1+rocm6.4" and t.python is None
    res = install(gfx906_lib, t)          # probe requested, but no interpreter is known: skipped, said so
    assert any("not probing" in w for w in res.warnings)
    rollback(resolve_target(None, env.lib_dir))
    assert env.files() == before


def test_read_only_lib_dir_is_refused(fake_env, gfx906_lib):
    if os.geteuid() == 0:
        pytest.skip("root can write anywhere")
    env = fake_env()
    env.lib_dir.chmod(0o555)
    try:
        with pytest.raises(G906Error, match="not writable"):
            install(gfx906_lib, target_of(env), probe=False)
    finally:
        env.lib_dir.chmod(0o755)


def test_cli_round_trip_json(fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    p = run_cli("install", gfx906_lib, "--python", env.python, "--no-probe", "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["action"] == "installed" and out["new"]["has_gfx906"] and out["new"]["sha256"] == sha(gfx906_lib)
    p = run_cli("status", "--python", env.python, "--json")
    s = json.loads(p.stdout)
    assert s["g906_swap"] and s["has_gfx906"] and s["backup"]["ok"]
    p = run_cli("status", "--python", env.python)
    assert "gfx906 device code: yes" in p.stdout and "g906 swap in place: yes" in p.stdout
    p = run_cli("rollback", "--python", env.python, "--dry-run", "--json")
    assert json.loads(p.stdout)["action"] == "dry_run"
    p = run_cli("rollback", "--python", env.python, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["action"] == "rolled_back"
    assert env.files() == before
    p = run_cli("rollback", "--python", env.python, "--json")
    assert p.returncode == 0 and json.loads(p.stdout)["action"] == "already_rolled_back"


def test_pure_python_libraries_work_too(fake_env, make_lib):
    """The no-compiler fallback (g906.binfmt.build_elf) yields libraries the swap accepts."""
    pure_stock = make_lib("stock-pure", archs=("gfx908",), pure=True)
    pure_new = make_lib("g906-pure", archs=("gfx906",), pure=True)
    env = fake_env(pure_stock)
    before = env.files()
    t = target_of(env)
    install(pure_new, t, probe=False)
    assert status(t)["active"]["rccl_version"].startswith("2.27.7")
    rollback(t)
    assert env.files() == before


def test_compiled_libraries_are_real_shared_objects(gfx906_lib):
    if not HAVE_CC:
        pytest.skip("no C compiler")
    import ctypes

    lib = ctypes.CDLL(str(gfx906_lib))
    v = ctypes.c_int()
    assert lib.ncclGetVersion(ctypes.byref(v)) == 0 and v.value == 22707


def test_write_failure_mid_install_is_a_message_and_recoverable(fake_env, gfx906_lib):
    """A real write failure (RLIMIT_FSIZE: the backup copy hits EFBIG) gives one sentence, not a
    traceback, leaves torch/lib intact, and a rerun without the limit finishes."""
    import resource
    import signal
    import subprocess
    import sys

    env = fake_env()
    before = env.files()
    limit = os.path.getsize(env.lib_dir / "librccl.so.1") // 2

    def small_files():
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    p = subprocess.run([sys.executable, "-m", "g906.cli.rccl", "install", str(gfx906_lib), "--python",
                        str(env.python), "--no-probe"], capture_output=True, text=True, preexec_fn=small_files,
                       env=dict(os.environ, PYTHONDONTWRITEBYTECODE="1"))
    assert_clean_error(p, "install stopped", "still complete")
    assert env.files() == before
    install(gfx906_lib, target_of(env), probe=False)
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)


def test_not_enough_space_is_refused_before_anything(fake_env, gfx906_lib, monkeypatch):
    import shutil
    from collections import namedtuple

    env = fake_env()
    before = env.files()
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(1 << 30, 1 << 30, 1 << 20))  # a full disk
    with pytest.raises(G906Error, match="not enough free space"):
        install(gfx906_lib, target_of(env), probe=False)
    assert env.files() == before


def test_lock_also_holds_across_state_folders(fake_env, gfx906_lib, tmp_path):
    """Another G906_STATE_DIR (another user) still cannot change the same torch/lib at the same time."""
    env = fake_env()
    before = env.files()
    with TargetLock(st.area_for(env.lib_dir, tmp_path / "other-state"), env.lib_dir):
        proc = run_cli("install", gfx906_lib, "--python", env.python, "--no-probe")
    assert_clean_error(proc, "different state folder")
    assert env.files() == before
