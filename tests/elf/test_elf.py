"""g906.binfmt: the ELF reader and the clang offload-bundle parser, on real shared objects built
with the system C compiler (when there is one) and on files from the pure-Python builder."""

from __future__ import annotations

import hashlib
import shutil
import struct
import subprocess
import zlib
from pathlib import Path

import pytest

from g906 import binfmt
from g906.binfmt import (
    EM_AMDGPU,
    EM_X86_64,
    ET_DYN,
    ET_REL,
    ElfError,
    build_elf,
    has_gfx_target,
    offload_targets,
    parse_offload_bundles,
    rccl_version,
    read_elf,
    read_offload_bundles,
    target_features,
    target_processor,
    write_offload_bundle,
)
from g906.errors import G906Error

GFX906 = "hipv4-amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-"
GFX908 = "hipv4-amdgcn-amd-amdhsa--gfx908:sramecc+:xnack-"
GFX1100 = "hipv4-amdgcn-amd-amdhsa--gfx1100"
HOST = "host-x86_64-unknown-linux-gnu-"

CC = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
OBJCOPY = shutil.which("objcopy")
READELF = shutil.which("readelf")
needs_toolchain = pytest.mark.skipif(not (CC and OBJCOPY), reason="needs a C compiler and objcopy")

C_SOURCE = r"""
const char rccl_version_string[] = "RCCL version : 2.22.3-develop:6b3b2d1";
int ncclGetVersion(int *v) { *v = 22203; return 0; }
"""


def bundle_entries(*ids: str) -> dict[str, bytes]:
    return {i: (b"" if i.startswith("host-") else b"\x7fELF" + i.encode() * 8) for i in ids}


def compile_so(tmp_path: Path, name: str = "librccl.so", soname: str = "librccl.so.1") -> Path:
    src = tmp_path / "rccl.c"
    src.write_text(C_SOURCE)
    out = tmp_path / name
    subprocess.run([CC, "-shared", "-fPIC", "-o", str(out), str(src), f"-Wl,-soname,{soname}"],
                   check=True, capture_output=True)
    return out


def add_fatbin(so: Path, payload: bytes, out: Path) -> Path:
    blob = so.parent / (out.name + ".fatbin")
    blob.write_bytes(payload)
    subprocess.run([OBJCOPY, "--add-section", f".hip_fatbin={blob}",
                    "--set-section-flags", ".hip_fatbin=alloc,readonly,data", str(so), str(out)],
                   check=True, capture_output=True)
    return out


# --- bundle format ---------------------------------------------------------------------------


def test_plain_bundle_layout_is_clangs():
    data = write_offload_bundle({HOST: b"", GFX906: b"CODE"}, align=1)
    assert data[:24] == b"__CLANG_OFFLOAD_BUNDLE__"
    (count,) = struct.unpack_from("<Q", data, 24)
    assert count == 2
    off, size, idlen = struct.unpack_from("<QQQ", data, 32)
    assert (size, idlen) == (0, len(HOST))
    assert data[56: 56 + idlen] == HOST.encode()
    pos = 56 + idlen
    off2, size2, idlen2 = struct.unpack_from("<QQQ", data, pos)
    assert data[pos + 24: pos + 24 + idlen2] == GFX906.encode()
    assert data[off2: off2 + size2] == b"CODE"


def test_plain_bundle_aligns_code_objects():
    data = write_offload_bundle({GFX906: b"A" * 10, GFX1100: b"B" * 10})
    entries = parse_offload_bundles(data)[0].entries
    assert [e.offset % 4096 for e in entries] == [0, 0]
    assert [data[e.offset: e.offset + e.size] for e in entries] == [b"A" * 10, b"B" * 10]


@pytest.mark.parametrize("method,method_id", [("zlib", 0), ("zstd", 1)])
@pytest.mark.parametrize("version,header_size", [(1, 20), (2, 24), (3, 32)])
def test_ccob_header_fields(method, method_id, version, header_size):
    plain = write_offload_bundle(bundle_entries(HOST, GFX906))
    data = write_offload_bundle(bundle_entries(HOST, GFX906), method, version=version)
    assert data[:4] == b"CCOB"
    assert struct.unpack_from("<HH", data, 4) == (version, method_id)
    md5_low = int.from_bytes(hashlib.md5(plain).digest()[:8], "little")
    if version == 1:
        usize, digest = struct.unpack_from("<IQ", data, 8)
    elif version == 2:
        total, usize, digest = struct.unpack_from("<IIQ", data, 8)
        assert total == len(data)
    else:
        total, usize, digest = struct.unpack_from("<QQQ", data, 8)
        assert total == len(data)
    assert usize == len(plain) and digest == md5_low
    payload = data[header_size:]
    if method == "zlib":
        assert zlib.decompress(payload) == plain
    else:
        import zstandard

        assert zstandard.ZstdDecompressor().decompress(payload, max_output_size=len(plain)) == plain


@pytest.mark.parametrize("method", [None, "zlib", "zstd"])
@pytest.mark.parametrize("version", [1, 2, 3])
def test_parse_roundtrip(method, version):
    data = write_offload_bundle(bundle_entries(HOST, GFX906, GFX1100), method, version=version)
    [bundle] = parse_offload_bundles(data)
    assert bundle.ids == [HOST, GFX906, GFX1100]
    assert bundle.compression == method
    assert bundle.ccob_version == (version if method else None)


def test_several_bundles_with_padding_and_false_magics():
    a = write_offload_bundle(bundle_entries(HOST, GFX906), "zstd", version=2)
    b = write_offload_bundle(bundle_entries(HOST, GFX1100), "zlib", version=3)
    c = write_offload_bundle(bundle_entries(GFX908))
    junk = b"CCOB\x07\x00\x09\x00" + b"__CLANG_OFFLOAD_BUNDLE__" + b"\xff" * 8 + b"CCOB\x03\x00\x00\x00" + b"\0" * 40
    blob = junk + a + b"\0" * 123 + b + b"\0" * 4096 + c
    found = parse_offload_bundles(blob)
    assert [x.ids for x in found] == [[HOST, GFX906], [HOST, GFX1100], [GFX908]]
    assert [x.compression for x in found] == ["zstd", "zlib", None]


def test_corrupt_compressed_payload_is_skipped():
    good = write_offload_bundle(bundle_entries(GFX906), "zlib", version=3)
    bad = bytearray(write_offload_bundle(bundle_entries(GFX1100), "zlib", version=3))
    bad[40:60] = b"\x00" * 20
    assert [x.ids for x in parse_offload_bundles(bytes(bad) + good)] == [[GFX906]]


def test_large_compressed_bundle_reads_only_the_table():
    entries = {f"hipv4-amdgcn-amd-amdhsa--gfx9{i:02d}": bytes(range(256)) * 4096 for i in range(8)}
    data = write_offload_bundle(entries, "zstd")
    [bundle] = parse_offload_bundles(data)
    assert len(bundle.entries) == 8


def test_target_id_parsing():
    assert target_processor(GFX906) == "gfx906"
    assert target_processor(GFX1100) == "gfx1100"
    assert target_processor("hipv4-amdgcn-amd-amdhsa--gfx90c:xnack-") == "gfx90c"
    assert target_processor("hipv4-amdgcn-amd-amdhsa--gfx9-generic:xnack-") == "gfx9-generic"
    assert target_processor("hip-amdgcn-amd-amdhsa-gfx906") == "gfx906"  # pre-v4 ids
    assert target_processor(HOST) is None
    assert target_features(GFX906) == {"sramecc": True, "xnack": False}
    assert target_features("gfx906") == {}


def test_has_gfx_target_on_ids():
    assert has_gfx_target([HOST, GFX906], "gfx906")
    assert not has_gfx_target([HOST, GFX908, GFX1100], "gfx906")
    assert not has_gfx_target([HOST], "gfx906")
    # features: a Radeon VII runs sramecc- ; code built for sramecc+ does not load there
    assert not has_gfx_target([GFX906], "gfx906:sramecc-:xnack-")
    assert has_gfx_target(["hipv4-amdgcn-amd-amdhsa--gfx906"], "gfx906:sramecc-:xnack-")
    assert has_gfx_target([GFX906], "gfx906:sramecc+:xnack-")
    generic = ["hipv4-amdgcn-amd-amdhsa--gfx9-generic:xnack-"]
    assert has_gfx_target(generic, "gfx906")
    assert not has_gfx_target(generic, "gfx906", allow_generic=False)
    assert not has_gfx_target(generic, "gfx1100")


def test_writer_rejects_bad_arguments():
    with pytest.raises(ValueError):
        write_offload_bundle({})
    with pytest.raises(ValueError):
        write_offload_bundle({GFX906: b"x"}, "lz4")
    with pytest.raises(ValueError):
        write_offload_bundle({GFX906: b"x"}, "zlib", version=4)


# --- ELF reader on the pure-Python builder ---------------------------------------------------


@pytest.mark.parametrize("elf_class", [32, 64])
@pytest.mark.parametrize("little_endian", [True, False])
def test_builder_roundtrip(tmp_path, elf_class, little_endian):
    fat = write_offload_bundle(bundle_entries(HOST, GFX906), "zlib")
    p = tmp_path / "lib.so"
    p.write_bytes(build_elf({".rodata": b"\0RCCL version 2.18.3-HEAD:abc+hip6.0\0", ".hip_fatbin": fat},
                            elf_class=elf_class, little_endian=little_endian, soname="librccl.so.1",
                            needed=["libamdhip64.so.6"]))
    e = read_elf(p)
    assert (e.elf_class, e.little_endian, e.type, e.machine) == (elf_class, little_endian, ET_DYN, EM_X86_64)
    assert e.machine_name == "x86_64" and e.type_name == "DYN" and e.is_shared_object
    assert e.soname == "librccl.so.1" and e.needed == ["libamdhip64.so.6"]
    assert e.section_bytes(".hip_fatbin") == fat
    assert offload_targets(p) == [HOST, GFX906]
    assert has_gfx_target(p, "gfx906")
    assert rccl_version(p) == "2.18.3-HEAD:abc+hip6.0"


def test_builder_other_machine_and_type(tmp_path):
    p = tmp_path / "k.o"
    p.write_bytes(build_elf({".text": b"\0" * 8}, machine=EM_AMDGPU, type=ET_REL))
    e = read_elf(p)
    assert (e.machine_name, e.type_name, e.soname) == ("amdgpu", "REL", None)
    with pytest.raises(ElfError, match="no section named"):
        e.section_bytes(".hip_fatbin")


def test_no_bundle_no_version(tmp_path):
    p = tmp_path / "libplain.so"
    p.write_bytes(build_elf({".rodata": b"hello\0"}))
    assert offload_targets(p) == []
    assert not has_gfx_target(p, "gfx906")
    assert rccl_version(p) is None


def test_bundle_outside_hip_fatbin_is_found(tmp_path):
    # e.g. bundles embedded in .rodata by older toolchains, or a bare .hipfb file
    fat = write_offload_bundle(bundle_entries(GFX906), "zstd")
    p = tmp_path / "liba.so"
    p.write_bytes(build_elf({".rodata": b"x" * 33 + fat}))
    assert offload_targets(p) == [GFX906]
    raw = tmp_path / "kernels.hipfb"
    raw.write_bytes(write_offload_bundle(bundle_entries(HOST, GFX1100)))
    assert offload_targets(raw) == [HOST, GFX1100]


def test_nccl_version_string_is_reported(tmp_path):
    p = tmp_path / "libnccl.so.2"
    p.write_bytes(build_elf({".rodata": b"\0NCCL version 2.21.5+cuda12.4\0"}))
    assert rccl_version(p) == "2.21.5+cuda12.4"


# --- errors ----------------------------------------------------------------------------------


def test_errors_are_g906_errors(tmp_path):
    assert issubclass(ElfError, G906Error)
    with pytest.raises(ElfError, match="no such file"):
        read_elf(tmp_path / "missing.so")
    with pytest.raises(ElfError, match="no such file"):
        offload_targets(tmp_path / "missing.so")
    with pytest.raises(ElfError, match="directory"):
        read_elf(tmp_path)
    text = tmp_path / "notes.txt"
    text.write_text("not an ELF file at all")
    with pytest.raises(ElfError, match="not an ELF file"):
        read_elf(text)
    empty = tmp_path / "empty.so"
    empty.write_bytes(b"")
    with pytest.raises(ElfError, match="not an ELF file"):
        read_elf(empty)
    assert offload_targets(empty) == []


def test_truncated_files(tmp_path):
    full = build_elf({".rodata": b"x" * 100, ".hip_fatbin": write_offload_bundle(bundle_entries(GFX906))},
                     soname="libx.so")
    for cut in (10, 30, len(full) - 20):
        p = tmp_path / f"cut{cut}.so"
        p.write_bytes(full[:cut])
        with pytest.raises(ElfError, match="truncated"):
            read_elf(p)


def test_bad_class_and_wrong_class(tmp_path):
    data = bytearray(build_elf({".a": b"1"}))
    data[4] = 7
    p = tmp_path / "bad.so"
    p.write_bytes(bytes(data))
    with pytest.raises(ElfError, match="class"):
        read_elf(p)
    p32 = tmp_path / "lib32.so"
    p32.write_bytes(build_elf({".a": b"1"}, elf_class=32))
    assert read_elf(p32).elf_class == 32
    with pytest.raises(ElfError, match="ELF32 file; an ELF64 file was expected"):
        read_elf(p32, elf_class=64)


def test_unreadable_file(tmp_path):
    import os

    if os.geteuid() == 0:
        pytest.skip("root reads everything")
    p = tmp_path / "secret.so"
    p.write_bytes(build_elf({".a": b"1"}))
    p.chmod(0)
    try:
        with pytest.raises(ElfError, match="permission denied"):
            read_elf(p)
    finally:
        p.chmod(0o644)


# --- real shared objects (system C compiler + objcopy) ---------------------------------------


@needs_toolchain
@pytest.mark.parametrize("method,version", [(None, 3), ("zlib", 3), ("zlib", 2), ("zstd", 3), ("zstd", 1)])
def test_real_shared_object_with_hip_fatbin(tmp_path, method, version):
    so = compile_so(tmp_path)
    base = read_elf(so)
    assert base.machine == EM_X86_64 or base.machine_name in ("aarch64", "ppc64", "riscv", "s390")
    assert base.type == ET_DYN and base.elf_class == 64 and base.soname == "librccl.so.1"
    assert ".hip_fatbin" not in base.sections
    assert offload_targets(so) == []
    assert rccl_version(so) == "2.22.3-develop:6b3b2d1"

    payload = write_offload_bundle(bundle_entries(HOST, GFX906, GFX1100), method, version=version)
    fat = add_fatbin(so, payload, tmp_path / "librccl_fat.so")
    e = read_elf(fat)
    assert e.soname == "librccl.so.1"
    assert e.section_bytes(".hip_fatbin") == payload
    assert offload_targets(fat) == [HOST, GFX906, GFX1100]
    assert has_gfx_target(fat, "gfx906")
    assert not has_gfx_target(fat, "gfx908")
    bundles = read_offload_bundles(fat)
    assert [b.compression for b in bundles] == [method]


@needs_toolchain
def test_real_shared_object_without_gfx906(tmp_path):
    so = compile_so(tmp_path)
    fat = add_fatbin(so, write_offload_bundle(bundle_entries(HOST, GFX908, GFX1100), "zstd"),
                     tmp_path / "librccl_official.so")
    assert offload_targets(fat) == [HOST, GFX908, GFX1100]
    assert not has_gfx_target(fat, "gfx906")


@needs_toolchain
@pytest.mark.skipif(not READELF, reason="needs readelf")
def test_sections_agree_with_readelf(tmp_path):
    so = add_fatbin(compile_so(tmp_path), write_offload_bundle(bundle_entries(GFX906)), tmp_path / "x.so")
    out = subprocess.run([READELF, "-W", "-S", str(so)], capture_output=True, text=True, check=True).stdout
    theirs = {}
    for line in out.splitlines():
        line = line.strip()
        if not line.startswith("[") or "]" not in line:
            continue
        rest = line.split("]", 1)[1].split()
        if len(rest) < 5 or rest[0] in ("Name", "NULL"):
            continue
        name, typ, _addr, off, size = rest[:5]
        if typ == "NULL":
            continue
        theirs[name] = (int(off, 16), 0 if typ == "NOBITS" else int(size, 16))
    ours = read_elf(so).sections
    assert theirs == {k: v for k, v in ours.items() if k in theirs}
    assert set(theirs) == set(ours)


def test_module_needs_no_pyelftools():
    for path in Path(binfmt.__file__).parent.glob("*.py"):
        src = path.read_text()
        assert "import elftools" not in src and "from elftools" not in src, path
