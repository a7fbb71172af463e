"""SOURCE handling: tarballs (safe reading only), folders and .so files."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from g906.errors import G906Error
from g906.rccl import install, resolve_target, rollback
from g906.rccl.source import open_source

from .helpers import assert_clean_error, run_cli, sha


def make_tarball(path, lib, *, mode="w:gz", top="rccl-gfx906-2.27.7-rocm7.2.4", extra=()):
    """A release tarball: <top>/lib/librccl.so.1.0 + librccl.so.1 -> librccl.so.1.0 + librccl.so -> librccl.so.1."""
    with tarfile.open(path, mode) as tar:
        d = tarfile.TarInfo(f"{top}/lib")
        d.type = tarfile.DIRTYPE
        tar.addfile(d)
        tar.add(lib, arcname=f"{top}/lib/librccl.so.1.0")
        for name, target in (("librccl.so.1", "librccl.so.1.0"), ("librccl.so", "librccl.so.1")):
            ti = tarfile.TarInfo(f"{top}/lib/{name}")
            ti.type = tarfile.SYMTYPE
            ti.linkname = target
            tar.addfile(ti)
        for info, data in extra:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


@pytest.mark.parametrize("mode,suffix", [("w:gz", ".tar.gz"), ("w:xz", ".tar.xz"), ("w", ".tar")])
def test_tarball_source(tmp_path, gfx906_lib, mode, suffix):
    tb = make_tarball(tmp_path / f"rccl-gfx906-2.27.7-rocm7.2.4{suffix}", gfx906_lib, mode=mode)
    src = open_source(tb, tmp_path / "staging")
    try:
        assert sha(src.path) == sha(gfx906_lib)
        assert src.member.endswith("lib/librccl.so.1.0")
    finally:
        src.cleanup()
    assert not any((tmp_path / "staging").iterdir())


def test_install_from_tarball_end_to_end(tmp_path, fake_env, gfx906_lib):
    env = fake_env()
    before = env.files()
    tb = make_tarball(tmp_path / "rccl-gfx906-2.27.7-rocm7.2.4.tar.gz", gfx906_lib)
    t = resolve_target(str(env.python))
    res = install(tb, t, probe=False)
    assert "!rccl-gfx906-2.27.7-rocm7.2.4/lib/librccl.so.1.0" in res.source
    assert sha(env.lib_dir / "librccl.so.1") == sha(gfx906_lib)
    assert os.readlink(env.lib_dir / "librccl.so") == "librccl.so.1"
    rollback(t)
    assert env.files() == before


def test_directory_and_so_sources(tmp_path, gfx906_lib):
    d = tmp_path / "rel" / "lib"
    d.mkdir(parents=True)
    (d / "librccl.so.1.0").write_bytes(gfx906_lib.read_bytes())
    os.symlink("librccl.so.1.0", d / "librccl.so.1")
    src = open_source(tmp_path / "rel", tmp_path / "staging")
    assert sha(src.path) == sha(gfx906_lib)
    src = open_source(gfx906_lib, tmp_path / "staging")
    assert src.path == gfx906_lib.resolve()


def _member(name, *, type_=tarfile.REGTYPE, linkname="", data=b"x"):
    ti = tarfile.TarInfo(name)
    ti.type = type_
    ti.linkname = linkname
    ti.size = len(data) if type_ == tarfile.REGTYPE else 0
    return ti, (data if type_ == tarfile.REGTYPE else None)


@pytest.mark.parametrize("member,why", [
    (dict(name="/etc/evil"), "absolute path"),
    (dict(name="../../evil"), "'..'"),
    (dict(name="top/../../evil"), "'..'"),
    (dict(name="top/lib/esc", type_=tarfile.SYMTYPE, linkname="/etc/passwd"), "outside the archive"),
    (dict(name="top/lib/esc", type_=tarfile.SYMTYPE, linkname="../../../etc/passwd"), "outside the archive"),
    (dict(name="top/lib/hard", type_=tarfile.LNKTYPE, linkname="../outside"), "outside the archive"),
    (dict(name="top/dev", type_=tarfile.CHRTYPE), "device"),
])
def test_unsafe_tarballs_are_refused(tmp_path, gfx906_lib, fake_env, member, why):
    env = fake_env()
    before = env.files()
    tb = make_tarball(tmp_path / "bad.tar.gz", gfx906_lib, top="top", extra=[_member(**member)])
    with pytest.raises(G906Error, match="unsafe to unpack") as ei:
        open_source(tb, tmp_path / "staging")
    assert why in ei.value.message
    p = run_cli("install", tb, "--python", env.python, "--no-probe")
    assert_clean_error(p, "unsafe to unpack")
    assert env.files() == before
    assert not (tmp_path / "evil").exists() and not (tmp_path.parent / "evil").exists()


def test_links_inside_the_archive_are_fine(tmp_path, gfx906_lib):
    extra = [_member("top/lib64", type_=tarfile.SYMTYPE, linkname="lib"),
             _member("top/share/x", type_=tarfile.SYMTYPE, linkname="../lib/librccl.so.1.0")]
    tb = make_tarball(tmp_path / "ok.tar.gz", gfx906_lib, top="top", extra=extra)
    src = open_source(tb, tmp_path / "staging")
    assert sha(src.path) == sha(gfx906_lib)
    src.cleanup()


def test_tarball_without_rccl(tmp_path):
    tb = tmp_path / "empty.tar.gz"
    with tarfile.open(tb, "w:gz") as tar:
        ti, data = _member("readme.txt")
        tar.addfile(ti, io.BytesIO(data))
    with pytest.raises(G906Error, match="contains no librccl"):
        open_source(tb, tmp_path / "staging")


def test_damaged_and_foreign_sources(tmp_path, gfx906_lib, fake_env):
    env = fake_env()
    tb = make_tarball(tmp_path / "r.tar.gz", gfx906_lib)
    cut = tmp_path / "cut.tar.gz"
    cut.write_bytes(tb.read_bytes()[: tb.stat().st_size // 2])
    p = run_cli("install", cut, "--python", env.python, "--no-probe")
    assert_clean_error(p)
    txt = tmp_path / "notes.txt"
    txt.write_text("hello")
    p = run_cli("install", txt, "--python", env.python, "--no-probe")
    assert_clean_error(p, "neither a tarball, a folder nor an ELF library")
    p = run_cli("install", tmp_path / "missing.tar.gz", "--python", env.python, "--no-probe")
    assert_clean_error(p, "does not exist")
