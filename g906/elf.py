"""ELF section reader and clang offload-bundle parser (pure Python, no pyelftools).

Shared by `g906 doctor` (does this librccl.so / librocblas.so carry gfx906 code?) and
`g906 rccl` (verify a package before swapping it in).

Formats, as LLVM defines them (all integers little-endian):

Offload bundle (clang-offload-bundler, what HIP puts in a library's ``.hip_fatbin``)::

    "__CLANG_OFFLOAD_BUNDLE__"            24 bytes
    number of entries                    u64
    per entry: offset u64 (from the bundle start), size u64, id length u64, id (no NUL)
    code objects (usually aligned to 4096)

Entry ids are ``<kind>-<triple>-<target id>``, e.g.
``hipv4-amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-`` (the triple's environment is empty, hence
the double dash) or ``host-x86_64-unknown-linux-gnu-``.

Compressed bundle (``--offload-compress``): ``"CCOB"``, version u16, method u16 (0 = zlib,
1 = zstd, llvm::compression::Format), then

    version 1: uncompressed size u32, hash u64                       (header 20 bytes)
    version 2: total size u32, uncompressed size u32, hash u64       (header 24 bytes)
    version 3: total size u64, uncompressed size u64, hash u64       (header 32 bytes)

followed by the compressed data, which decompresses to a plain bundle. "total size" counts the
header; the hash is the first 8 bytes of the MD5 of the uncompressed bundle (MD5Result::low()).
A library's ``.hip_fatbin`` may hold several bundles one after another (padded/aligned).
"""

from __future__ import annotations

import hashlib
import mmap
import os
import re
import struct
import zlib
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from g906.errors import G906Error

__all__ = [
    "ElfError",
    "ElfFile",
    "read_elf",
    "OffloadEntry",
    "OffloadBundle",
    "read_offload_bundles",
    "parse_offload_bundles",
    "offload_targets",
    "target_processor",
    "target_features",
    "has_gfx_target",
    "gfx_targets",
    "rccl_version",
    "write_offload_bundle",
    "build_elf",
    "BUNDLE_MAGIC",
    "CCOB_MAGIC",
    "EM_X86_64",
    "EM_AARCH64",
    "EM_AMDGPU",
    "ET_REL",
    "ET_EXEC",
    "ET_DYN",
]


class ElfError(G906Error):
    """A file is not a readable ELF object (or not the kind that was expected)."""


# --- constants -------------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"
BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"

ET_NONE, ET_REL, ET_EXEC, ET_DYN, ET_CORE = 0, 1, 2, 3, 4
_ET_NAMES = {ET_NONE: "NONE", ET_REL: "REL", ET_EXEC: "EXEC", ET_DYN: "DYN", ET_CORE: "CORE"}

EM_386, EM_ARM, EM_X86_64, EM_AARCH64, EM_RISCV, EM_AMDGPU = 3, 40, 62, 183, 243, 224
EM_PPC64, EM_S390 = 21, 22
_EM_NAMES = {
    EM_386: "i386",
    EM_ARM: "arm",
    EM_X86_64: "x86_64",
    EM_AARCH64: "aarch64",
    EM_RISCV: "riscv",
    EM_AMDGPU: "amdgpu",
    EM_PPC64: "ppc64",
    EM_S390: "s390",
}

SHT_NULL, SHT_PROGBITS, SHT_STRTAB, SHT_DYNAMIC, SHT_NOBITS = 0, 1, 3, 6, 8
SHN_XINDEX = 0xFFFF
DT_NULL, DT_NEEDED, DT_SONAME = 0, 1, 14

_COMPRESSION_METHODS = {0: "zlib", 1: "zstd"}
_CCOB_HEADER_SIZES = {1: 20, 2: 24, 3: 32}

# Generic processors (LLVM AMDGPUUsage): a code object for the generic target runs on each of
# these processors when the runtime supports generic code objects (code object v6, ROCm 6.3+).
GENERIC_TARGETS: dict[str, frozenset[str]] = {
    "gfx9-generic": frozenset({"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"}),
}


# --- ELF -------------------------------------------------------------------------------------


@dataclass
class ElfFile:
    """The parts of an ELF file's header and section table g906 needs.

    machine: e_machine (EM_X86_64 = 62, EM_AMDGPU = 224, ...); machine_name: "x86_64", ...
    elf_class: 32 or 64.  type: e_type (ET_DYN = 3 for shared objects); type_name: "DYN", ...
    sections: name -> (file offset, size in the file); SHT_NOBITS sections have size 0 there.
    soname: DT_SONAME from .dynamic, or None.  needed: DT_NEEDED entries.
    """

    path: Path
    elf_class: int
    little_endian: bool
    type: int
    machine: int
    osabi: int
    sections: dict[str, tuple[int, int]] = field(default_factory=dict)
    section_types: dict[str, int] = field(default_factory=dict)
    soname: str | None = None
    needed: list[str] = field(default_factory=list)
    file_size: int = 0

    @property
    def machine_name(self) -> str:
        return _EM_NAMES.get(self.machine, f"EM_{self.machine}")

    @property
    def type_name(self) -> str:
        return _ET_NAMES.get(self.type, f"ET_{self.type}")

    @property
    def is_shared_object(self) -> bool:
        return self.type == ET_DYN

    def has_section(self, name: str) -> bool:
        return name in self.sections

    def section_bytes(self, name: str) -> bytes:
        """The bytes of section `name` as stored in the file (b"" for SHT_NOBITS)."""
        if name not in self.sections:
            raise ElfError(
                f"{self.path}: no section named {name!r}",
                hint=f"sections present: {', '.join(sorted(n for n in self.sections if n)) or 'none'}",
            )
        offset, size = self.sections[name]
        if size == 0:
            return b""
        try:
            with open(self.path, "rb") as f:
                f.seek(offset)
                data = f.read(size)
        except OSError as exc:
            raise ElfError(f"cannot read {self.path}: {exc.strerror or exc}") from exc
        if len(data) != size:
            raise ElfError(f"{self.path}: section {name!r} runs past the end of the file (truncated?)")
        return data


def _open_for_read(path: Path):
    try:
        return open(path, "rb")
    except FileNotFoundError as exc:
        raise ElfError(f"{path}: no such file", hint="check the path") from exc
    except IsADirectoryError as exc:
        raise ElfError(f"{path} is a directory, not an ELF file") from exc
    except PermissionError as exc:
        raise ElfError(f"{path}: permission denied", hint="check the file's permissions") from exc
    except OSError as exc:
        raise ElfError(f"cannot open {path}: {exc.strerror or exc}") from exc


def read_elf(path: str | os.PathLike, *, elf_class: int | None = None) -> ElfFile:
    """Parse the ELF header, section table and dynamic section of `path`.

    Raises ElfError for a missing/unreadable file, a non-ELF file, a truncated or corrupt
    header/section table, or (when `elf_class` is 32 or 64) an ELF of the other class.
    """
    path = Path(path)
    with _open_for_read(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
        except OSError:  # pragma: no cover
            size = 0
        ident = f.read(16)
        if len(ident) < 4 or ident[:4] != ELF_MAGIC:
            raise ElfError(
                f"{path} is not an ELF file",
                hint="expected a shared library such as librccl.so (it starts with \\x7fELF)",
            )
        if len(ident) < 16:
            raise ElfError(f"{path}: ELF header is truncated ({size} bytes)")
        cls_byte, data_byte = ident[4], ident[5]
        if cls_byte not in (1, 2):
            raise ElfError(f"{path}: invalid ELF class byte {cls_byte} (expected 1 = ELF32 or 2 = ELF64)")
        if data_byte not in (1, 2):
            raise ElfError(f"{path}: invalid ELF data encoding {data_byte}")
        bits = 32 if cls_byte == 1 else 64
        if elf_class is not None and bits != elf_class:
            raise ElfError(
                f"{path} is an ELF{bits} file; an ELF{elf_class} file was expected",
                hint="use a library built for this machine's architecture",
            )
        e = "<" if data_byte == 1 else ">"
        if bits == 64:
            hdr_fmt = e + "HHIQQQIHHHHHH"
        else:
            hdr_fmt = e + "HHIIIIIHHHHHH"
        hdr_size = struct.calcsize(hdr_fmt)
        raw = f.read(hdr_size)
        if len(raw) < hdr_size:
            raise ElfError(f"{path}: ELF header is truncated ({size} bytes)")
        (e_type, e_machine, _ver, _entry, _phoff, e_shoff, _flags, _ehsize, _phentsize, _phnum,
         e_shentsize, e_shnum, e_shstrndx) = struct.unpack(hdr_fmt, raw)

        elf = ElfFile(path=path, elf_class=bits, little_endian=(e == "<"), type=e_type,
                      machine=e_machine, osabi=ident[7], file_size=size)
        if e_shoff == 0:
            return elf  # no section table (allowed, e.g. some stripped executables)

        sh_fmt = e + ("IIQQQQIIQQ" if bits == 64 else "IIIIIIIIII")
        sh_size = struct.calcsize(sh_fmt)
        if e_shentsize < sh_size:
            raise ElfError(f"{path}: corrupt ELF header (section entry size {e_shentsize})")

        def read_sh(index: int) -> tuple:
            off = e_shoff + index * e_shentsize
            if off + sh_size > size:
                raise ElfError(f"{path}: section table runs past the end of the file (truncated?)")
            f.seek(off)
            return struct.unpack(sh_fmt, f.read(sh_size))

        shnum, shstrndx = e_shnum, e_shstrndx
        if shnum == 0 or shstrndx == SHN_XINDEX:
            first = read_sh(0)
            if shnum == 0:
                shnum = first[5]  # sh_size of section 0 holds the real count
            if shstrndx == SHN_XINDEX:
                shstrndx = first[6]  # sh_link of section 0
        if shnum > 1_000_000:
            raise ElfError(f"{path}: corrupt ELF section count {shnum}")
        if e_shoff + shnum * e_shentsize > size:
            raise ElfError(f"{path}: section table runs past the end of the file (truncated?)")
        f.seek(e_shoff)
        table = f.read(shnum * e_shentsize)
        headers = [struct.unpack_from(sh_fmt, table, i * e_shentsize) for i in range(shnum)]

        def read_range(off: int, n: int, what: str) -> bytes:
            if off + n > size:
                raise ElfError(f"{path}: {what} runs past the end of the file (truncated?)")
            f.seek(off)
            return f.read(n)

        names_blob = b""
        if 0 < shstrndx < shnum:
            h = headers[shstrndx]
            names_blob = read_range(h[4], h[5], "section name table")

        def cstr(blob: bytes, off: int) -> str:
            if off >= len(blob):
                return ""
            end = blob.find(b"\0", off)
            return blob[off: end if end >= 0 else len(blob)].decode("utf-8", "replace")

        dynamic_idx = None
        for i, h in enumerate(headers):
            sh_name, sh_type, _fl, _addr, sh_offset, sh_sz = h[0], h[1], h[2], h[3], h[4], h[5]
            if i == 0 and sh_type == SHT_NULL:
                continue
            name = cstr(names_blob, sh_name)
            file_sz = 0 if sh_type == SHT_NOBITS else sh_sz
            if sh_type != SHT_NOBITS and sh_offset + sh_sz > size:
                raise ElfError(f"{path}: section {name!r} runs past the end of the file (truncated?)")
            if name not in elf.sections:
                elf.sections[name] = (sh_offset, file_sz)
                elf.section_types[name] = sh_type
            if sh_type == SHT_DYNAMIC and dynamic_idx is None:
                dynamic_idx = i

        if dynamic_idx is not None:
            dh = headers[dynamic_idx]
            link = dh[6]
            if 0 < link < shnum:
                sh = headers[link]
                strtab = read_range(sh[4], sh[5], "dynamic string table")
                dyn = read_range(dh[4], dh[5], "dynamic section")
                ent_fmt = e + ("qQ" if bits == 64 else "iI")
                ent = struct.calcsize(ent_fmt)
                for k in range(len(dyn) // ent):
                    tag, val = struct.unpack_from(ent_fmt, dyn, k * ent)
                    if tag == DT_NULL:
                        break
                    if tag == DT_SONAME:
                        elf.soname = cstr(strtab, val)
                    elif tag == DT_NEEDED:
                        elf.needed.append(cstr(strtab, val))
        return elf


# --- offload bundles -------------------------------------------------------------------------


@dataclass(frozen=True)
class OffloadEntry:
    id: str
    offset: int  # from the start of the (decompressed) bundle
    size: int

    @property
    def processor(self) -> str | None:
        return target_processor(self.id)


@dataclass(frozen=True)
class OffloadBundle:
    entries: tuple[OffloadEntry, ...]
    compression: str | None = None        # None, "zlib" or "zstd"
    ccob_version: int | None = None
    position: int = 0                     # where the bundle starts within the scanned data

    @property
    def ids(self) -> list[str]:
        return [e.id for e in self.entries]


_BUNDLE_HEAD = 24 + 8


def _parse_plain_header(data: bytes | memoryview, start: int, limit: int) -> tuple[list[OffloadEntry], int] | None:
    """Entries of the plain bundle at data[start:], or None when it is not a sane bundle.
    Returns (entries, end) where end is the furthest byte any entry reaches (absolute)."""
    if limit - start < _BUNDLE_HEAD:
        return None
    (count,) = struct.unpack_from("<Q", data, start + 24)
    if count == 0 or count > 100_000:
        return None
    pos = start + _BUNDLE_HEAD
    entries: list[OffloadEntry] = []
    end = pos
    for _ in range(count):
        if pos + 24 > limit:
            return None
        off, size, idlen = struct.unpack_from("<QQQ", data, pos)
        pos += 24
        if idlen == 0 or idlen > 4096 or pos + idlen > limit:
            return None
        raw_id = bytes(data[pos: pos + idlen])
        pos += idlen
        try:
            entry_id = raw_id.decode("ascii")
        except UnicodeDecodeError:
            return None
        if not entry_id.isprintable():
            return None
        entries.append(OffloadEntry(entry_id, off, size))
        end = max(end, pos, start + off + size)
    return entries, end


def _decompress_prefix(method: str, payload, want: int) -> bytes:
    """Decompress at least `want` bytes (or all there is) of a zlib/zstd stream, feeding the
    input in pieces so a large payload is neither copied nor fully decompressed."""
    if method == "zlib":
        d = zlib.decompressobj()
    else:
        import zstandard

        d = zstandard.ZstdDecompressor().decompressobj()
    out = bytearray()
    step = 64 * 1024
    mv = memoryview(payload)
    try:
        for i in range(0, len(mv), step):
            out += d.decompress(mv[i: i + step])
            if len(out) >= want or getattr(d, "eof", False):
                break
    finally:
        mv.release()
    return bytes(out)


def _parse_ccob(data, start: int, limit: int) -> tuple[OffloadBundle, int] | None:
    """The compressed bundle at data[start:] -> (bundle, end) or None if not a sane one.
    Only the start of the payload is decompressed: enough to read the entry table."""
    if limit - start < 8:
        return None
    version, method_id = struct.unpack_from("<HH", data, start + 4)
    if version not in _CCOB_HEADER_SIZES or method_id not in _COMPRESSION_METHODS:
        return None
    hsize = _CCOB_HEADER_SIZES[version]
    if limit - start < hsize:
        return None
    total: int | None
    if version == 1:
        (usize,) = struct.unpack_from("<I", data, start + 8)
        total = None
    elif version == 2:
        total, usize = struct.unpack_from("<II", data, start + 8)
    else:
        total, usize = struct.unpack_from("<QQ", data, start + 8)
    if total is not None and (total <= hsize or start + total > limit):
        return None
    if usize < _BUNDLE_HEAD:
        return None
    method = _COMPRESSION_METHODS[method_id]
    payload_end = start + total if total is not None else limit
    want = min(usize, 64 * 1024)
    parsed = None
    with memoryview(data) as whole:
        payload = whole[start + hsize: payload_end]
        try:
            while True:
                try:
                    head = _decompress_prefix(method, payload, want)
                except Exception:  # zlib.error, zstandard.ZstdError: not a real bundle here
                    return None
                if head[:24] != BUNDLE_MAGIC:
                    return None
                parsed = _parse_plain_header(head, 0, len(head))
                if parsed is not None or want >= usize or len(head) < want:
                    break
                want = min(usize, want * 8)
        finally:
            payload.release()
    if parsed is None:
        return None
    entries, _ = parsed
    end = payload_end if total is not None else start + hsize + 1
    bundle = OffloadBundle(tuple(entries), compression=method, ccob_version=version, position=start)
    return bundle, end


def parse_offload_bundles(data, start: int = 0, end: int | None = None) -> list[OffloadBundle]:
    """Every plain or compressed offload bundle found in data[start:end], in order.

    `data` is bytes, bytearray or an mmap. Scans for both magics, so it works on a .hip_fatbin
    section (bundles one after another with padding), on a whole file, or on a standalone .hipfb.
    Candidates that do not parse are skipped. OffloadBundle.position is relative to `start`."""
    limit = len(data) if end is None else min(end, len(data))
    bundles: list[OffloadBundle] = []
    pos = start
    # the next position of each magic, searched again only once the scan has passed it
    # (searching both every time would rescan the same megabytes for the rarer one)
    p_plain = p_ccob = -2
    while pos < limit:
        if p_plain != -1 and p_plain < pos:
            p_plain = data.find(BUNDLE_MAGIC, pos, limit)
        if p_ccob != -1 and p_ccob < pos:
            p_ccob = data.find(CCOB_MAGIC, pos, limit)
        cands = [p for p in (p_plain, p_ccob) if p >= 0]
        if not cands:
            break
        p = min(cands)
        if p == p_plain:
            parsed = _parse_plain_header(data, p, limit)
            if parsed is None:
                pos = p + 1
                continue
            entries, stop = parsed
            bundles.append(OffloadBundle(tuple(entries), position=p - start))
            # skip the code objects when they lie inside the region, else just the table
            table_end = p + _BUNDLE_HEAD + sum(24 + len(e.id) for e in entries)
            pos = stop if stop <= limit else table_end
        else:
            got = _parse_ccob(data, p, limit)
            if got is None:
                pos = p + 1
                continue
            bundle, stop = got
            bundles.append(OffloadBundle(bundle.entries, bundle.compression, bundle.ccob_version, p - start))
            pos = max(stop, p + 4)
    return bundles


def read_offload_bundles(path: str | os.PathLike) -> list[OffloadBundle]:
    """The offload bundles of a file: from its .hip_fatbin section when it is an ELF file that
    has one, else from anywhere in the file (ELF or not, e.g. a .hipfb or a .co bundle)."""
    path = Path(path)
    try:
        elf: ElfFile | None = read_elf(path)
    except ElfError:
        elf = None
        _open_for_read(path).close()  # missing / unreadable files still raise ElfError
    with _open_for_read(path) as f:
        try:
            size = os.fstat(f.fileno()).st_size
        except OSError:  # pragma: no cover
            size = 0
        if size == 0:
            return []
        try:
            mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        except (OSError, ValueError) as exc:
            raise ElfError(f"cannot map {path}: {exc}") from exc
        try:
            if elf is not None and ".hip_fatbin" in elf.sections:
                off, sz = elf.sections[".hip_fatbin"]
                found = parse_offload_bundles(mm, off, off + sz)
                if found:
                    return found
            return parse_offload_bundles(mm)
        finally:
            mm.close()


def offload_targets(path: str | os.PathLike) -> list[str]:
    """Entry ids of every offload bundle in `path` (deduplicated, first-seen order), e.g.
    ["host-x86_64-unknown-linux-gnu-", "hipv4-amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-", ...].
    Compressed (CCOB) bundles are decompressed (zlib or zstd). [] when the file has none."""
    seen: dict[str, None] = {}
    for bundle in read_offload_bundles(path):
        for entry in bundle.entries:
            seen.setdefault(entry.id, None)
    return list(seen)


_PROC_RE = re.compile(r"(?<![0-9A-Za-z])(gfx[0-9]+(?:-[0-9]+)*-generic|gfx[0-9a-f]+)(?=$|:)")


def target_processor(entry_id: str) -> str | None:
    """"hipv4-amdgcn-amd-amdhsa--gfx906:sramecc+:xnack-" -> "gfx906"; "...--gfx9-generic" ->
    "gfx9-generic"; host entries and non-AMDGPU entries -> None. Also accepts a bare target id."""
    if entry_id.startswith("host-"):
        return None
    m = _PROC_RE.search(entry_id)
    return m.group(1) if m else None


def target_features(target: str) -> dict[str, bool]:
    """Target-id features: "gfx906:sramecc+:xnack-" -> {"sramecc": True, "xnack": False}.
    Also accepts a full entry id. A feature that is not named means "any"."""
    tail = target.split(":", 1)[1] if ":" in target else ""
    out: dict[str, bool] = {}
    for feat in tail.split(":") if tail else []:
        if feat.endswith(("+", "-")) and len(feat) > 1:
            out[feat[:-1]] = feat.endswith("+")
    return out


def _features_compatible(code: Mapping[str, bool], device: Mapping[str, bool]) -> bool:
    return all(device.get(k, v) == v for k, v in code.items())


def gfx_targets(ids: Iterable[str]) -> list[str]:
    """Device processors named by bundle entry ids (deduplicated, first-seen order)."""
    out: dict[str, None] = {}
    for i in ids:
        p = target_processor(i)
        if p and not i.startswith("host-"):
            out.setdefault(p, None)
    return list(out)


def has_gfx_target(
    path_or_ids: str | os.PathLike | Sequence[str],
    gfx: str,
    *,
    allow_generic: bool = True,
) -> bool:
    """Does the file (or this list of entry ids) hold device code that runs on `gfx`?

    `gfx` is a processor ("gfx906") or a target id with features ("gfx906:sramecc-:xnack-"); with
    features, code objects built for the opposite setting do not count (a code object that does
    not name a feature runs either way). Generic code objects (gfx9-generic) count for their
    members when allow_generic is true."""
    ids = list(path_or_ids) if isinstance(path_or_ids, (list, tuple)) else offload_targets(path_or_ids)
    want_proc = gfx.split(":", 1)[0]
    want_feats = target_features(gfx)
    for entry_id in ids:
        if entry_id.startswith("host-"):
            continue
        proc = target_processor(entry_id)
        if proc is None:
            continue
        if proc != want_proc and not (allow_generic and want_proc in GENERIC_TARGETS.get(proc, ())):
            continue
        if _features_compatible(target_features(entry_id.split("--", 1)[-1]), want_feats):
            return True
    return False


# --- RCCL version ----------------------------------------------------------------------------

# RCCL's init.cc embeds the version for `strings` to find: "RCCL version : 2.22.3-..." (newer)
# or "RCCL version 2.18.3-HEAD:abc+hip6.0" (older). NCCL builds say "NCCL version 2.21.5+cuda12.4".
_RCCL_VERSION_RE = re.compile(rb"RCCL version\s*:?\s*([0-9]+\.[0-9]+\.[0-9]+[\x21-\x7e]*)")
_NCCL_VERSION_RE = re.compile(rb"NCCL version\s*:?\s*([0-9]+\.[0-9]+\.[0-9]+[\x21-\x7e]*)")


def rccl_version(path: str | os.PathLike) -> str | None:
    """The version string a librccl.so embeds ("2.22.3", "2.18.3-HEAD:abc+hip6.0"), or None.
    Looks in .rodata first, then in the whole file. Falls back to an NCCL version string."""
    path = Path(path)
    elf = read_elf(path)
    regions: list[tuple[int, int]] = []
    if ".rodata" in elf.sections:
        regions.append(elf.sections[".rodata"])
    regions.append((0, elf.file_size))
    with _open_for_read(path) as f:
        if elf.file_size == 0:
            return None
        mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        try:
            for rx in (_RCCL_VERSION_RE, _NCCL_VERSION_RE):
                for off, size in regions:
                    m = rx.search(mm, off, off + size)
                    if m:
                        return m.group(1).decode("ascii")
        finally:
            mm.close()
    return None


# --- writers (for tests and tools) -----------------------------------------------------------


def _align(n: int, a: int) -> int:
    return (n + a - 1) // a * a if a > 1 else n


def write_offload_bundle(
    entries: Mapping[str, bytes] | Sequence[tuple[str, bytes]],
    compress: str | None = None,
    *,
    version: int = 3,
    align: int = 4096,
    level: int | None = None,
) -> bytes:
    """Build a clang offload bundle: plain, or CCOB-compressed ("zlib" / "zstd", header
    `version` 1, 2 or 3). `entries`: entry id -> code object bytes, in order."""
    items = list(entries.items()) if isinstance(entries, Mapping) else [(str(k), bytes(v)) for k, v in entries]
    if not items:
        raise ValueError("an offload bundle needs at least one entry")
    head = len(BUNDLE_MAGIC) + 8 + sum(24 + len(i.encode("ascii")) for i, _ in items)
    offsets = []
    pos = head
    for _, blob in items:
        pos = _align(pos, align)
        offsets.append(pos)
        pos += len(blob)
    out = bytearray(BUNDLE_MAGIC + struct.pack("<Q", len(items)))
    for (entry_id, blob), off in zip(items, offsets):
        raw = entry_id.encode("ascii")
        out += struct.pack("<QQQ", off, len(blob), len(raw)) + raw
    for (_, blob), off in zip(items, offsets):
        out += b"\0" * (off - len(out))
        out += blob
    plain = bytes(out)
    if compress is None:
        return plain
    if compress == "zlib":
        method, payload = 0, zlib.compress(plain, 6 if level is None else level)
    elif compress == "zstd":
        import zstandard

        method = 1
        payload = zstandard.ZstdCompressor(level=5 if level is None else level).compress(plain)
    else:
        raise ValueError(f"unknown compression {compress!r} (expected None, 'zlib' or 'zstd')")
    digest = int.from_bytes(hashlib.md5(plain).digest()[:8], "little")
    if version == 1:
        header = CCOB_MAGIC + struct.pack("<HHIQ", 1, method, len(plain), digest)
    elif version == 2:
        total = 24 + len(payload)
        header = CCOB_MAGIC + struct.pack("<HHIIQ", 2, method, total, len(plain), digest)
    elif version == 3:
        total = 32 + len(payload)
        header = CCOB_MAGIC + struct.pack("<HHQQQ", 3, method, total, len(plain), digest)
    else:
        raise ValueError(f"unknown compressed bundle version {version} (1, 2 or 3)")
    return header + payload


def build_elf(
    sections: Mapping[str, bytes] | Sequence[tuple[str, bytes]] = (),
    *,
    elf_class: int = 64,
    machine: int = EM_X86_64,
    type: int = ET_DYN,  # noqa: A002 - mirrors e_type
    soname: str | None = None,
    needed: Sequence[str] = (),
    little_endian: bool = True,
) -> bytes:
    """A minimal but well-formed ELF file (no program headers) holding the given PROGBITS
    sections, plus .dynstr/.dynamic when `soname` or `needed` is given, and .shstrtab.
    readelf/objdump read it; it is not loadable. For tests where no C compiler exists."""
    if elf_class not in (32, 64):
        raise ValueError("elf_class must be 32 or 64")
    e = "<" if little_endian else ">"
    items = list(sections.items()) if isinstance(sections, Mapping) else list(sections)
    sec: list[dict] = []  # name, type, flags, data, link, entsize, align
    for name, data in items:
        sec.append(dict(name=name, type=SHT_PROGBITS, flags=0x2, data=bytes(data), link=0, entsize=0, align=16))
    if soname is not None or needed:
        dynstr = bytearray(b"\0")
        dyn_entries = []
        for lib in needed:
            dyn_entries.append((DT_NEEDED, len(dynstr)))
            dynstr += lib.encode() + b"\0"
        if soname is not None:
            dyn_entries.append((DT_SONAME, len(dynstr)))
            dynstr += soname.encode() + b"\0"
        dyn_entries.append((DT_NULL, 0))
        ent_fmt = e + ("qQ" if elf_class == 64 else "iI")
        dyn_data = b"".join(struct.pack(ent_fmt, t, v) for t, v in dyn_entries)
        dynstr_index = len(sec) + 1
        sec.append(dict(name=".dynstr", type=SHT_STRTAB, flags=0x2, data=bytes(dynstr), link=0, entsize=0, align=1))
        sec.append(dict(name=".dynamic", type=SHT_DYNAMIC, flags=0x3, data=dyn_data, link=dynstr_index,
                        entsize=struct.calcsize(ent_fmt), align=8))
    shstr = bytearray(b"\0")
    name_off = []
    for s in sec:
        name_off.append(len(shstr))
        shstr += s["name"].encode() + b"\0"
    shstr_name = len(shstr)
    shstr += b".shstrtab\0"
    sec.append(dict(name=".shstrtab", type=SHT_STRTAB, flags=0, data=bytes(shstr), link=0, entsize=0, align=1))
    name_off.append(shstr_name)

    ehsize = 64 if elf_class == 64 else 52
    shentsize = 64 if elf_class == 64 else 40
    body = bytearray(ehsize)
    offsets = []
    for s in sec:
        pad = _align(len(body), s["align"]) - len(body)
        body += b"\0" * pad
        offsets.append(len(body))
        body += s["data"]
    body += b"\0" * (_align(len(body), 8) - len(body))
    shoff = len(body)
    sh_fmt = e + ("IIQQQQIIQQ" if elf_class == 64 else "IIIIIIIIII")
    body += b"\0" * shentsize  # SHT_NULL
    for s, off, noff in zip(sec, offsets, name_off):
        body += struct.pack(sh_fmt, noff, s["type"], s["flags"], 0, off, len(s["data"]), s["link"], 0,
                            s["align"], s["entsize"])
    ident = ELF_MAGIC + bytes([1 if elf_class == 32 else 2, 1 if little_endian else 2, 1, 0]) + b"\0" * 8
    if elf_class == 64:
        hdr = struct.pack(e + "HHIQQQIHHHHHH", type, machine, 1, 0, 0, shoff, 0, ehsize, 0, 0, shentsize,
                          len(sec) + 1, len(sec))
    else:
        hdr = struct.pack(e + "HHIIIIIHHHHHH", type, machine, 1, 0, 0, shoff, 0, ehsize, 0, 0, shentsize,
                          len(sec) + 1, len(sec))
    body[0:ehsize] = ident + hdr
    return bytes(body)


def iter_code_objects(path: str | os.PathLike) -> Iterator[tuple[str, bytes]]:  # pragma: no cover - tools
    """(entry id, code object bytes) for every plain bundle entry of `path` (debugging aid)."""
    data = Path(path).read_bytes()
    for bundle in parse_offload_bundles(data):
        if bundle.compression is None:
            for entry in bundle.entries:
                yield entry.id, data[bundle.position + entry.offset: bundle.position + entry.offset + entry.size]
