"""ELF reader (pure Python, no pyelftools): header, section table, SONAME and DT_NEEDED.

Enough of ELF for `g906 doctor` and `g906 rccl` to tell what a shared library is (class,
machine, type, SONAME), to find its sections (.hip_fatbin holds the GPU code, see
offload_bundle.py) and the RCCL version string it embeds. build_elf writes small well-formed
files for tests on machines without a C compiler.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence

from g906.errors import G906Error


class ElfError(G906Error):
    """A file is not a readable ELF object (or not the kind that was expected)."""


# --- constants -------------------------------------------------------------------------------

ELF_MAGIC = b"\x7fELF"

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


def open_for_read(path: Path):
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
    with open_for_read(path) as f:
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
    with open_for_read(path) as f:
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


# --- writer (for tests and tools) ------------------------------------------------------------


def align_up(n: int, a: int) -> int:
    return (n + a - 1) // a * a if a > 1 else n


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
        pad = align_up(len(body), s["align"]) - len(body)
        body += b"\0" * pad
        offsets.append(len(body))
        body += s["data"]
    body += b"\0" * (align_up(len(body), 8) - len(body))
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
