"""clang offload bundles: which GPU targets a library carries code for (pure Python).

Shared by `g906 doctor` (does this librccl.so carry gfx906 code?) and `g906 rccl` (verify a
package before swapping it in). Formats, as LLVM defines them (all integers little-endian):

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
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Iterator, Mapping, Sequence

from g906.binfmt.elf import ElfError, ElfFile, align_up, open_for_read, read_elf

BUNDLE_MAGIC = b"__CLANG_OFFLOAD_BUNDLE__"
CCOB_MAGIC = b"CCOB"

_COMPRESSION_METHODS = {0: "zlib", 1: "zstd"}
_CCOB_HEADER_SIZES = {1: 20, 2: 24, 3: 32}

# Generic processors (LLVM AMDGPUUsage): a code object for the generic target runs on each of
# these processors when the runtime supports generic code objects (code object v6, ROCm 6.3+).
GENERIC_TARGETS: dict[str, frozenset[str]] = {
    "gfx9-generic": frozenset({"gfx900", "gfx902", "gfx904", "gfx906", "gfx909", "gfx90c"}),
}


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
        open_for_read(path).close()  # missing / unreadable files still raise ElfError
    with open_for_read(path) as f:
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


# --- target ids ------------------------------------------------------------------------------

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



# --- writer (for tests and tools) ------------------------------------------------------------


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
        pos = align_up(pos, align)
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



def iter_code_objects(path: str | os.PathLike) -> Iterator[tuple[str, bytes]]:  # pragma: no cover - tools
    """(entry id, code object bytes) for every plain bundle entry of `path` (debugging aid)."""
    data = Path(path).read_bytes()
    for bundle in parse_offload_bundles(data):
        if bundle.compression is None:
            for entry in bundle.entries:
                yield entry.id, data[bundle.position + entry.offset: bundle.position + entry.offset + entry.size]
