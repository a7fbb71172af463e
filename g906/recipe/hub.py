"""Hugging Face Hub ids as model sources: `org/name`, `org/name:REVISION`, and for GGUF repos
`org/name:QUANT` (Q4_K_M, IQ4_XS, Q8_0, F16, ...), resolved through huggingface_hub.

    spec = parse_hub_id("unsloth/Qwen3.5-9B-GGUF:Q4_K_M")     # HubSpec, or None for a non-id
    path = cached_model(spec)        # the local file/directory in the HF cache, or None (no network)
    path = fetch_model(spec)         # the cache first; else a download with a progress bar

The cache is the one huggingface_hub keeps (HF_HOME / HF_HUB_CACHE; models--org--name/
snapshots/<commit>/..., refs/<branch>), so what `hf download` fetched is found, and
HF_HUB_OFFLINE=1 works once the files are there. A GGUF source resolves to the file to open
(the first part of a split set); a safetensors repo to its snapshot directory. No torch here."""

from __future__ import annotations

import fnmatch
import logging
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path

from g906.errors import G906Error

log = logging.getLogger("g906.progress")

_REPO_RE = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")
# llama.cpp's quant names as they appear in GGUF file names (and as `-hf repo:QUANT` takes them)
_QUANT_RE = re.compile(r"(?i)(?:UD-)?(?:I?Q[1-8](?:_[A-Z0-9]+)*|F16|BF16|F32|MXFP4(?:_MOE)?|TQ[12]_0)")
DEFAULT_QUANT = "Q4_K_M"          # llama.cpp's choice when a GGUF repo id names no quant
_SPLIT_RE = re.compile(r"-(\d{5})-of-(\d{5})\.gguf$", re.I)
# what a safetensors model needs; weights in other formats (.bin, .pth, onnx) are never fetched
HF_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken", "*.py"]


@dataclass(frozen=True)
class HubSpec:
    repo_id: str
    revision: str | None = None      # a branch, tag or commit
    quant: str | None = None         # GGUF repos: the quant tag of the file to serve

    def __str__(self) -> str:
        tag = self.quant or self.revision
        return self.repo_id + (f":{tag}" if tag else "")


def parse_hub_id(text: str) -> HubSpec | None:
    """A Hub id (org/name[:tag]) or None. The tag is a quant when it looks like one, else a revision."""
    s = text.strip()
    repo, sep, tag = s.partition(":")
    if not _REPO_RE.fullmatch(repo) or repo.endswith((".gguf", ".toml")) or (sep and not tag):
        return None
    if ".." in repo or repo.startswith("."):
        return None
    if not tag:
        return HubSpec(repo)
    if not re.fullmatch(r"[\w./-]+", tag):
        return None
    if _QUANT_RE.fullmatch(tag):
        return HubSpec(repo, quant=tag.upper())
    return HubSpec(repo, revision=tag)


class HubError(G906Error):
    pass


def _offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def _model_ggufs(files: list[str]) -> list[str]:
    return sorted(f for f in files if f.lower().endswith(".gguf") and "mmproj" not in f.rsplit("/", 1)[-1].lower())


def _quant_of(name: str) -> str | None:
    stem = _SPLIT_RE.sub(".gguf", name.rsplit("/", 1)[-1])[: -len(".gguf")]
    for part in reversed(re.split(r"[-.]", stem)):
        if _QUANT_RE.fullmatch(part):
            return part.upper()
    m = re.search(r"(?i)(?:UD-)?I?Q[1-8](?:_[A-Z0-9]+)*$", stem)
    return m.group(0).upper() if m else None


def quant_tags(files: list[str]) -> list[str]:
    """The quant tags a GGUF repo offers (from its file names)."""
    return sorted({q for q in (_quant_of(f) for f in _model_ggufs(files)) if q})


def _first_part(paths: list[str]) -> str:
    firsts = [p for p in paths if (m := _SPLIT_RE.search(p)) is None or int(m.group(1)) == 1]
    return sorted(firsts or paths)[0]


def choose_gguf(spec: HubSpec, files: list[str]) -> list[str]:
    """The GGUF files of the spec's quant (every part of a split set; the first part first)."""
    ggufs = _model_ggufs(files)
    if spec.quant is not None:
        picked = [f for f in ggufs if _quant_of(f) == spec.quant]
        if not picked:
            tags = ", ".join(quant_tags(files)) or "none"
            raise HubError(f"{spec.repo_id} has no {spec.quant} GGUF file",
                           hint=f"quants in the repo: {tags}; e.g. `g906 up {spec.repo_id}:{(quant_tags(files) or ['Q4_K_M'])[0]}`")
    elif len(ggufs) == 1 or (ggufs and len({_SPLIT_RE.sub('', f) for f in ggufs}) == 1):
        picked = ggufs
    else:
        picked = [f for f in ggufs if _quant_of(f) == DEFAULT_QUANT]
        if not picked:
            raise HubError(f"{spec.repo_id} holds several GGUF files; say which quant to serve",
                           hint="add the quant tag: " + ", ".join(f"{spec.repo_id}:{q}" for q in quant_tags(files)[:6]))
    first = _first_part(picked)
    base = _SPLIT_RE.sub("", first)
    group = sorted(f for f in picked if _SPLIT_RE.sub("", f) == base)
    return [first] + [f for f in group if f != first]


def _kind(files: list[str]) -> str:
    if any(f.endswith(".safetensors") for f in files) or "config.json" in files:
        return "hf" if any(f.endswith(".safetensors") for f in files) else "unknown"
    return "gguf" if _model_ggufs(files) else "unknown"


def _snapshot_files(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def _wanted(spec: HubSpec, files: list[str]) -> tuple[str, list[str]]:
    """(kind, the repo files the model needs) for a repo's file list."""
    kind = _kind(files)
    if kind == "gguf" or (spec.quant is not None and _model_ggufs(files)):
        return "gguf", choose_gguf(spec, files)
    if kind == "hf":
        if spec.quant is not None:
            raise HubError(f"{spec.repo_id} is a safetensors repo; the tag :{spec.quant} names a GGUF quant",
                           hint=f"serve it as `{spec.repo_id}` (or name a revision after the colon)")
        return "hf", [f for f in files if any(fnmatch.fnmatch(f.rsplit('/', 1)[-1], p) for p in HF_PATTERNS)
                      and "/" not in f]
    raise HubError(f"{spec.repo_id} holds neither safetensors weights nor GGUF files",
                   hint="g906 serves Hugging Face safetensors repos and GGUF repos")


def _local_snapshot(spec: HubSpec) -> Path | None:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(spec.repo_id, revision=spec.revision, local_files_only=True))
    except (LocalEntryNotFoundError, FileNotFoundError, OSError, ValueError):
        return None


def cached_model(spec: HubSpec) -> Path | None:
    """The spec's model in the local HF cache (a GGUF file or a snapshot directory), or None when
    the cache lacks the files it needs. Never touches the network."""
    snap = _local_snapshot(spec)
    if snap is None or not snap.is_dir():
        return None
    files = _snapshot_files(snap)
    try:
        kind, wanted = _wanted(spec, files)
    except HubError:        # the cache holds part of the repo only: the Hub's own list decides
        return None
    if kind == "hf":
        if "config.json" not in files or not any(f.endswith(".safetensors") for f in files):
            return None
        return snap
    m = _SPLIT_RE.search(wanted[0])
    if m is not None:       # a split set: every part, not only those the cache happens to hold
        n = int(m.group(2))
        wanted = [_SPLIT_RE.sub(f"-{i:05d}-of-{n:05d}.gguf", wanted[0]) for i in range(1, n + 1)]
    if not all((snap / f).is_file() for f in wanted):
        return None
    return snap / wanted[0]


def fetch_model(spec: HubSpec, *, token: str | None = None) -> Path:
    """The spec's model from the cache, downloaded first when it is not there (huggingface_hub's
    progress bars). HF_HUB_OFFLINE=1: the cache only, with a clear message when it lacks it."""
    found = cached_model(spec)
    if found is not None:
        return found
    if _offline():
        raise HubError(f"{spec} is not in the Hugging Face cache and HF_HUB_OFFLINE is set",
                       hint=f"fetch it while online with `g906 pull {spec}` (or `hf download {spec.repo_id}`), "
                       "or unset HF_HUB_OFFLINE")
    from huggingface_hub import HfApi, snapshot_download
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    try:
        files = HfApi(token=token).list_repo_files(spec.repo_id, revision=spec.revision)
        kind, wanted = _wanted(spec, files)
        log.info("Downloading %s: %d file(s) into the Hugging Face cache", spec, len(wanted))
        t0 = time.perf_counter()
        snap = Path(snapshot_download(spec.repo_id, revision=spec.revision, allow_patterns=wanted, token=token))
        size = sum((snap / f).stat().st_size for f in wanted if (snap / f).is_file())
        log.info("Downloaded %s: %d file(s), %.1f MiB in %.1fs (%s)", spec, len(wanted), size / 2**20,
                 time.perf_counter() - t0, snap)
    except GatedRepoError:
        raise HubError(f"{spec.repo_id} is a gated repo: accept its licence on huggingface.co first",
                       hint="then log in with `hf auth login` (or set HF_TOKEN)") from None
    except RepositoryNotFoundError:
        raise HubError(f"{spec.repo_id}: no such model on the Hugging Face Hub (or it is private)",
                       hint="check the id; for a private repo log in with `hf auth login` (or set HF_TOKEN)") from None
    except RevisionNotFoundError:
        raise HubError(f"{spec.repo_id} has no revision {spec.revision!r}",
                       hint="give a branch, tag or commit of the repo") from None
    except HfHubHTTPError as exc:
        raise HubError(f"downloading {spec}: {exc}", hint="check the network, or set HF_HUB_OFFLINE=1 to use "
                       "only the cache") from None
    except OSError as exc:
        raise HubError(f"downloading {spec}: {exc}",
                       hint="check the network and the free space of the HF cache (HF_HOME)") from None
    return snap if kind == "hf" else snap / wanted[0]
