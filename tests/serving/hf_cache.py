"""Test helper: a Hugging Face cache laid out as huggingface_hub lays it out, written file by file:

    <cache>/models--ORG--NAME/blobs/<etag>                      the content
    <cache>/models--ORG--NAME/snapshots/<commit>/<path>         a relative symlink to the blob
    <cache>/models--ORG--NAME/refs/<branch>                     the commit the branch points at

Blob names are the files' etags: the sha256 of large (LFS) files and the git blob sha1 of the
others, as the Hub serves them. The tests check the layout with huggingface_hub's own cache
scanner (scan_cache_dir), so a mistake here shows as a scan error, not as a passing test."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

LFS_SUFFIXES = (".safetensors", ".gguf", ".bin")


def _etag(name: str, data: bytes) -> str:
    if name.endswith(LFS_SUFFIXES):
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_to_hf_cache(cache: Path, repo_id: str, files: dict[str, bytes | Path], *, commit: str | None = None,
                    branch: str = "main") -> Path:
    """Write files (repo path -> bytes or a file to copy) as one commit of repo_id; returns the snapshot."""
    repo = cache / ("models--" + repo_id.replace("/", "--"))
    contents = {k: (v.read_bytes() if isinstance(v, Path) else v) for k, v in files.items()}
    if commit is None:
        h = hashlib.sha1()
        for k in sorted(contents):
            h.update(k.encode() + b"\0" + hashlib.sha1(contents[k]).digest())
        commit = h.hexdigest()
    snap = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True, exist_ok=True)
    for name, data in contents.items():
        blob = repo / "blobs" / _etag(name, data)
        if not blob.exists():
            blob.write_bytes(data)
        link = snap / name
        link.parent.mkdir(parents=True, exist_ok=True)
        os.symlink(os.path.relpath(blob, link.parent), link)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / branch).write_text(commit)
    return snap


def dir_files(d: Path) -> dict[str, Path]:
    return {str(p.relative_to(d)): p for p in sorted(d.rglob("*")) if p.is_file()}
