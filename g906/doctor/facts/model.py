"""The Facts model: a plain, JSON-serialisable snapshot of one machine, saved by
`g906 doctor --collect FILE` and read back by `--from FILE` (or `g906 up --facts FILE`).

The JSON shape is the contract between those two runs: FACTS_SCHEMA changes whenever a saved
file would no longer mean the same thing, and from_json refuses unknown fields and wrong types
with a message instead of a traceback.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from g906.errors import G906Error, UsageError
from g906.kfd import visible_gpus

FACTS_SCHEMA = 1


@dataclass
class Facts:
    """What the doctor knows about one machine. Every field is plain JSON data."""

    schema: int = FACTS_SCHEMA
    collected_at: str = ""
    g906_version: str = ""
    root: str = "/"
    platform: dict[str, Any] = field(default_factory=dict)   # system, machine, kernel
    user: dict[str, Any] = field(default_factory=dict)       # uid, name, gids, groups (names)
    env: dict[str, str] = field(default_factory=dict)
    gpus: list[dict[str, Any]] = field(default_factory=list)  # AMD GPUs from the KFD topology
    kfd: dict[str, Any] = field(default_factory=dict)        # topology present, GPU processes
    device_nodes: dict[str, Any] = field(default_factory=dict)  # /dev/kfd, /dev/dri/renderD*
    driver: dict[str, Any] = field(default_factory=dict)     # amdgpu loaded/version
    nvidia: dict[str, Any] = field(default_factory=dict)     # driver version, GPU models
    rocm: dict[str, Any] = field(default_factory=dict)       # path, version, rocminfo
    python: dict[str, Any] = field(default_factory=dict)     # the inspected interpreter
    torch: dict[str, Any] = field(default_factory=dict)
    triton: dict[str, Any] = field(default_factory=dict)
    rocblas: dict[str, Any] = field(default_factory=dict)    # library + Tensile search
    rccl: dict[str, Any] = field(default_factory=dict)       # library, soname, version, targets
    rccl_swap: dict[str, Any] = field(default_factory=dict)  # g906 rccl manifest state
    memory: dict[str, Any] = field(default_factory=dict)     # host RAM
    errors: list[str] = field(default_factory=list)          # collectors that crashed
    timings: dict[str, float] = field(default_factory=dict)

    # -- serialisation ---------------------------------------------------------------------------
    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, data: Any, *, source: str = "facts") -> "Facts":
        if not isinstance(data, dict):
            raise UsageError(f"{source}: expected a JSON object of g906 doctor facts")
        if data.get("schema") != FACTS_SCHEMA:
            raise UsageError(
                f"{source}: facts schema {data.get('schema')!r} is not supported (expected {FACTS_SCHEMA})",
                hint="collect the facts again with this g906 version: g906 doctor --collect FILE",
            )
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise UsageError(f"{source}: unknown facts field(s): {', '.join(unknown)}",
                             hint="was this file written by `g906 doctor --collect`?")
        kwargs = {}
        for f in fields(cls):
            if f.name in data:
                value = data[f.name]
                default = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
                if default is not None and not isinstance(value, type(default)):
                    raise UsageError(f"{source}: field {f.name!r} should be a {type(default).__name__}")
                kwargs[f.name] = value
        return cls(**kwargs)

    def save(self, path: str | os.PathLike) -> None:
        path = Path(path)
        text = json.dumps(self.to_json(), indent=2, sort_keys=True) + "\n"
        tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
        try:
            tmp.write_text(text, encoding="utf-8")
            os.replace(tmp, path)
        except OSError as exc:
            tmp.unlink(missing_ok=True)
            raise G906Error(f"cannot write the facts to {path}: {exc.strerror or exc}",
                            hint="pick a writable path") from exc

    @classmethod
    def load(cls, path: str | os.PathLike) -> "Facts":
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            raise UsageError(f"{path}: no such facts file", hint="write one with: g906 doctor --collect FILE") from None
        except OSError as exc:
            raise UsageError(f"cannot read {path}: {exc.strerror or exc}") from None
        try:
            data = json.loads(text)
        except json.JSONDecodeError as exc:
            raise UsageError(f"{path}: not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})",
                             hint="pass a file written by `g906 doctor --collect`") from None
        return cls.from_json(data, source=str(path))

    # -- derived views the checks share ------------------------------------------------------------
    def amd_gpus(self) -> list[dict[str, Any]]:
        return list(self.gpus)

    def visible_amd_gpus(self) -> list[dict[str, Any]]:
        """KFD GPUs a HIP process would see, after ROCR_/HIP_/CUDA_VISIBLE_DEVICES."""
        return visible_gpus(self.gpus, self.env)


def parse_visible(value: str | None) -> list[str] | None:
    if value is None:
        return None
    return [t.strip() for t in value.split(",") if t.strip()]
