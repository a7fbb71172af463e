"""Turn SOURCE (a release tarball, a folder, or a .so file) into one local librccl file.

Tarballs are checked member by member before anything is read: absolute names, ".." parts that climb out,
links that point outside the archive and device files make the whole archive refused. Only
the chosen library is written out (into g906's staging folder), never the archive's own paths.
"""

from __future__ import annotations

import os
import posixpath
import shutil
import tarfile
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from g906.errors import G906Error, UsageError
from g906.rccl.fsutil import CHUNK
from g906.rccl.target import RCCL_NAME_RE

PREFERRED = "librccl.so.1"


@dataclass
class SourceLib:
    path: Path                  # a local, readable regular file
    display: str                # what to call it in messages
    member: str | None = None   # path inside the tarball / folder
    _tmpdir: Path | None = field(default=None, repr=False)

    def cleanup(self) -> None:
        if self._tmpdir is not None:
            shutil.rmtree(self._tmpdir, ignore_errors=True)
            self._tmpdir = None


def open_source(source: str | os.PathLike, staging: Path) -> SourceLib:
    src = Path(source).expanduser()
    if not os.path.lexists(src):
        raise UsageError(f"RCCL source {src} does not exist.",
                         hint="pass a release tarball (.tar.gz/.tar.xz), a folder holding librccl.so.1, or the .so file.")
    if src.is_dir():
        return _from_dir(src)
    try:
        with open(src, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise UsageError(f"cannot read RCCL source {src}: {exc.strerror or exc}.", hint="check the path and permissions.") from None
    if head == b"\x7fELF":
        return SourceLib(path=src.resolve(), display=str(src))
    if head[:4] == b"\x28\xb5\x2f\xfd":
        raise UsageError(f"{src} is zstd-compressed; g906 reads .tar.gz, .tar.xz, .tar.bz2 and .tar.",
                         hint=f"unpack it first (zstd -d {src}) and pass the .tar or the folder.")
    if _is_tar(src):
        return _from_tar(src, staging)
    raise UsageError(f"{src} is neither a tarball, a folder nor an ELF library.",
                     hint="pass a release tarball (.tar.gz/.tar.xz), a folder holding librccl.so.1, or the .so file.")


def _is_tar(path: Path) -> bool:
    try:
        return tarfile.is_tarfile(path)
    except (OSError, EOFError, tarfile.TarError):
        return False


def _pick(candidates: dict[str, str], resolve, where: str) -> str:
    """candidates: relative path -> kind ("file"/"symlink"). Prefer what librccl.so.1 resolves to."""
    if not candidates:
        raise G906Error(f"{where} contains no librccl.so* file.",
                        hint="check that this is an RCCL release (it should hold lib/librccl.so.1).")
    named = [p for p in candidates if posixpath.basename(p) == PREFERRED]
    if len(named) > 1:
        raise G906Error(f"{where} holds several {PREFERRED}: {', '.join(sorted(named))}.",
                        hint="pass the folder or the .so you mean instead.")
    if named:
        return resolve(named[0])
    files = sorted({resolve(p) for p in candidates})
    if len(files) == 1:
        return files[0]
    raise G906Error(f"{where} holds several RCCL libraries and none named {PREFERRED}: {', '.join(files)}.",
                    hint="pass the .so file you mean instead.")


# --- folders ---------------------------------------------------------------------------------

def _from_dir(root: Path) -> SourceLib:
    candidates: dict[str, str] = {}
    base_depth = len(root.parts)
    for dirpath, dirnames, filenames in os.walk(root):
        if len(Path(dirpath).parts) - base_depth >= 3:
            dirnames[:] = []
        for name in filenames + [d for d in dirnames if os.path.islink(os.path.join(dirpath, d))]:
            if RCCL_NAME_RE.match(name):
                rel = os.path.relpath(os.path.join(dirpath, name), root)
                candidates[rel] = "symlink" if os.path.islink(os.path.join(root, rel)) else "file"

    def resolve(rel: str) -> str:
        real = os.path.realpath(root / rel)
        if not os.path.isfile(real):
            raise G906Error(f"{root / rel} is a broken link.", hint="fix the folder or pass the .so itself.")
        return os.path.relpath(real, root) if real.startswith(str(root.resolve()) + os.sep) else real

    chosen = _pick(candidates, resolve, str(root))
    path = Path(chosen) if os.path.isabs(chosen) else (root.resolve() / chosen)
    return SourceLib(path=path, display=f"{root}/{chosen}" if not os.path.isabs(chosen) else chosen, member=chosen)


# --- tarballs --------------------------------------------------------------------------------

def _norm_member(name: str) -> str | None:
    """Normalised relative path, or None when the name is absolute or climbs out with '..'."""
    if name.startswith("/") or name.startswith("\\") or (len(name) > 1 and name[1] == ":"):
        return None
    parts = []
    for part in name.replace("\\", "/").split("/"):
        if part in ("", "."):
            continue
        if part == "..":
            if not parts:
                return None
            parts.pop()
            continue
        parts.append(part)
    return "/".join(parts)


def check_tar_members(tar: tarfile.TarFile, where: str) -> dict[str, tarfile.TarInfo]:
    """All members by normalised name; G906Error on the first unsafe one."""
    members: dict[str, tarfile.TarInfo] = {}
    for m in tar.getmembers():
        norm = _norm_member(m.name)

        def unsafe(why: str) -> G906Error:
            return G906Error(f"{where} is unsafe to unpack: member {m.name!r} {why}.",
                             hint="get the release from a trusted place; g906 will not read this archive.")

        if norm is None:
            raise unsafe("has an absolute path or '..' in its name")
        if m.ischr() or m.isblk() or m.isfifo() or m.isdev():
            raise unsafe("is a device or FIFO")
        if m.issym():
            target = m.linkname
            if target.startswith("/") or _norm_member(posixpath.join(posixpath.dirname(norm), target)) is None:
                raise unsafe(f"is a link pointing outside the archive ({target})")
        if m.islnk():
            if _norm_member(m.linkname) is None:
                raise unsafe(f"is a hard link pointing outside the archive ({m.linkname})")
        members[norm] = m
    return members


def _from_tar(src: Path, staging: Path) -> SourceLib:
    where = str(src)
    try:
        tar = tarfile.open(src, "r:*")
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise UsageError(f"cannot open {src} as a tarball: {exc}.", hint="check that the download is complete.") from None
    with tar:
        try:
            members = check_tar_members(tar, where)
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise G906Error(f"{src} is damaged: {exc}.", hint="download the release again.") from None
        candidates = {n: ("symlink" if m.issym() else "file") for n, m in members.items()
                      if RCCL_NAME_RE.match(posixpath.basename(n)) and (m.isfile() or m.issym() or m.islnk())}

        def resolve(name: str, depth: int = 0) -> str:
            m = members.get(name)
            if m is None or depth > 8:
                raise G906Error(f"{where}: {name} is a broken link inside the archive.", hint="download the release again.")
            if m.issym():
                return resolve(_norm_member(posixpath.join(posixpath.dirname(name), m.linkname)) or "", depth + 1)
            if m.islnk():
                return resolve(_norm_member(m.linkname) or "", depth + 1)
            if not m.isfile():
                raise G906Error(f"{where}: {name} is not a file.", hint="download the release again.")
            return name

        chosen = _pick(candidates, resolve, where)
        staging.mkdir(parents=True, exist_ok=True)
        tmpdir = Path(tempfile.mkdtemp(prefix=f"{os.getpid()}-", dir=staging))
        out = tmpdir / "librccl.so.1"
        try:
            fin = tar.extractfile(members[chosen])
            if fin is None:
                raise G906Error(f"{where}: cannot read {chosen}.", hint="download the release again.")
            with fin, open(out, "wb") as fout:
                while True:
                    block = fin.read(CHUNK)
                    if not block:
                        break
                    fout.write(block)
        except (tarfile.TarError, OSError, EOFError) as exc:
            shutil.rmtree(tmpdir, ignore_errors=True)
            if isinstance(exc, OSError) and exc.errno is not None and exc.errno == 28:
                raise G906Error(f"no space left to unpack {chosen} into {staging}.", hint="free some disk space.") from None
            raise G906Error(f"{src} is damaged ({exc}).", hint="download the release again.") from None
        except G906Error:
            shutil.rmtree(tmpdir, ignore_errors=True)
            raise
    return SourceLib(path=out, display=f"{src}!{chosen}", member=chosen, _tmpdir=tmpdir)


def clean_stale_staging(staging: Path) -> None:
    """Remove unpack folders left by processes that no longer run (call under the lock)."""
    if not staging.is_dir():
        return
    for entry in staging.iterdir():
        pid_text = entry.name.split("-", 1)[0]
        if pid_text.isdigit() and _alive(int(pid_text)):
            continue
        shutil.rmtree(entry, ignore_errors=True) if entry.is_dir() else entry.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
