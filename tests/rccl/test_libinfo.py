"""Validation of a candidate library before anything is touched."""

from __future__ import annotations

import pytest

from g906.binfmt import EM_AARCH64, ET_EXEC, build_elf
from g906.errors import G906Error
from g906.rccl.libinfo import inspect_library, validate_new_library

from .helpers import bundle_for


def write(tmp_path, name, data):
    p = tmp_path / name
    p.write_bytes(data)
    return p


def test_good_library(gfx906_lib):
    info = inspect_library(gfx906_lib)
    assert info.problem is None and info.has_gfx906
    assert info.soname == "librccl.so.1" and info.machine == "x86_64" and info.elf_class == 64
    assert info.rccl_version.startswith("2.27.7")
    assert validate_new_library(info, source="x", force=False) == []


@pytest.mark.parametrize("compress", ["zlib", "zstd"])
def test_compressed_bundles_are_read(make_lib, compress):
    info = inspect_library(make_lib("ccob", archs=("gfx906",), compress=compress))
    assert info.has_gfx906 and info.gfx_archs == ["gfx906"]


@pytest.mark.parametrize("kwargs,needle", [
    (dict(elf_class=32, soname="librccl.so.1"), "32-bit"),
    (dict(machine=EM_AARCH64, soname="librccl.so.1"), "aarch64"),
    (dict(type=ET_EXEC, soname="librccl.so.1"), "not a shared object"),
    (dict(soname="librccl.so.2"), "SONAME is 'librccl.so.2'"),
    (dict(), "no SONAME"),
])
def test_wrong_shapes_are_refused(tmp_path, kwargs, needle):
    p = write(tmp_path, "librccl.so.1", build_elf([(".hip_fatbin", bundle_for(["gfx906"], "t"))], **kwargs))
    info = inspect_library(p)
    assert needle in info.problem
    with pytest.raises(G906Error, match="not a usable librccl"):
        validate_new_library(info, source=str(p), force=True)     # --force does not cover these


def test_not_elf(tmp_path):
    info = inspect_library(write(tmp_path, "librccl.so.1", b"#!/bin/sh\n"))
    assert info.problem
    with pytest.raises(G906Error, match="not a usable librccl"):
        validate_new_library(info, source="x", force=False)


def test_no_device_code_at_all(make_lib):
    info = inspect_library(make_lib("nodev", archs=()))
    assert info.gfx_archs == [] and not info.has_gfx906
    with pytest.raises(G906Error, match=r"no gfx906 device code \(found: none\)"):
        validate_new_library(info, source="x", force=False)
    warnings = validate_new_library(info, source="x", force=True)
    assert warnings and "WARNING" in warnings[0]


def test_generic_gfx9_code_counts(make_lib):
    assert inspect_library(make_lib("generic", archs=("gfx9-generic",))).has_gfx906
