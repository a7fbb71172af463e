"""What resolve() needs from GGUF files: the shards of a split set and the header facts
(architecture, tensor types, layer/head counts). Only headers are read; every failure of a
corrupt or foreign file becomes a ModelFileError with a message naming the file."""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from g906.arch import lookup, qwen35

GGUF_MAGIC = b"GGUF"
EXPERT_TENSOR_RE = re.compile(r"\.ffn_(gate|up|down|gate_up)_exps\.weight$")
SHARD_RE = re.compile(r"^(?P<stem>.+)-(?P<idx>\d{5})-of-(?P<total>\d{5})\.gguf$", re.IGNORECASE)


class ModelFileError(Exception):
    def __init__(self, message: str, help: str | None = None):
        super().__init__(message)
        self.message = message
        self.help = help


@dataclass
class GGUFHeader:
    path: Path
    architecture: str | None
    tensor_types: Counter = field(default_factory=Counter)
    scalars: dict[str, Any] = field(default_factory=dict)    # every scalar key/value
    array_lengths: dict[str, int] = field(default_factory=dict)
    # stacked MoE expert tensors (ffn_*_exps): their types and bytes
    expert_types: Counter = field(default_factory=Counter)
    expert_bytes: int = 0


def split_parts(path: Path) -> tuple[str, int, int] | None:
    """(stem, index, total) for NAME-0000K-of-0000N.gguf, else None."""
    m = SHARD_RE.match(path.name)
    if not m:
        return None
    return m.group("stem"), int(m.group("idx")), int(m.group("total"))


def shard_paths(path: Path) -> list[Path]:
    """Every file of the set `path` belongs to (just [path] when it is not split)."""
    parts = split_parts(path)
    if parts is None:
        return [path]
    stem, idx, total = parts
    if total < 1 or idx < 1 or idx > total:
        raise ModelFileError(f"{path.name}: shard {idx} of {total} is not a valid split-file name")
    if idx != 1:
        first = path.with_name(f"{stem}-{1:05d}-of-{total:05d}.gguf")
        raise ModelFileError(
            f"{path.name} is shard {idx} of {total}; model.source must name the first shard",
            f'source = "{first.name}"',
        )
    return [path.with_name(f"{stem}-{k:05d}-of-{total:05d}.gguf") for k in range(1, total + 1)]


def check_magic(path: Path) -> None:
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    if head != GGUF_MAGIC:
        shown = "an empty file" if not head else f"it starts with {head!r}"
        raise ModelFileError(f"{path} is not a GGUF file ({shown}, not b'GGUF')",
                             "check the path; a GGUF model file starts with the bytes GGUF")


def read_header(path: Path) -> GGUFHeader:
    """Parse a GGUF header (g906.binfmt.gguf); any failure is a ModelFileError."""
    check_magic(path)
    try:
        from g906.binfmt.gguf import GGUFFile, GGUFFormatError  # noqa: PLC0415 - numpy-heavy, only when needed
    except Exception as exc:  # noqa: BLE001
        raise ModelFileError(f"cannot read GGUF files: the gguf package failed to import ({exc})",
                             "pip install gguf") from None
    try:
        with GGUFFile(path) as f:
            header = GGUFHeader(path=path, architecture=None)
            for name, fld in f.fields.items():
                if fld.is_array:
                    header.array_lengths[name] = fld.count
                else:
                    header.scalars[name] = fld.value
            for t in f.tensors:
                header.tensor_types[t.type_name] += 1
                if EXPERT_TENSOR_RE.search(t.name):
                    header.expert_types[t.type_name] += 1
                    header.expert_bytes += t.n_bytes
    except GGUFFormatError as exc:
        raise ModelFileError(f"{path} is a damaged or truncated GGUF file: {exc.located}",
                             "download it again and compare its size or checksum with the source") from None
    except OSError as exc:
        raise ModelFileError(f"cannot read {path}: {exc.strerror or exc}") from None
    arch = header.scalars.get("general.architecture")
    header.architecture = arch if isinstance(arch, str) else None
    return header


def header_facts(header: GGUFHeader) -> dict[str, Any]:
    """model_facts from a first-shard header: normalised names plus every scalar
    "<arch>.*" key under "gguf" (without the prefix)."""
    facts: dict[str, Any] = {}
    arch = header.architecture or ""
    raw = {k[len(arch) + 1:]: v for k, v in header.scalars.items() if arch and k.startswith(arch + ".")}
    known = lookup(arch)
    keys = known.gguf_fact_keys if known is not None and known.gguf_fact_keys else qwen35.GGUF_FACT_KEYS
    for gguf_key, name in keys.items():
        v = raw.get(gguf_key)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            facts[name] = int(v)
    if "vocab_size" not in facts and "tokenizer.ggml.tokens" in header.array_lengths:
        facts["vocab_size"] = header.array_lengths["tokenizer.ggml.tokens"]
    for key in ("general.name", "general.file_type", "split.count"):
        if key in header.scalars:
            facts[key.split(".", 1)[1] if key.startswith("general.") else "split_count"] = header.scalars[key]
    facts["gguf"] = {k: v for k, v in raw.items() if isinstance(v, (int, float, str, bool))}
    return facts
