"""The compatibility matrix (g906/data/compat.toml) as functions: version matching, known-good
stacks, and the known-bad recipe combinations. Shared by the doctor and recipe validation."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from g906 import data as _data


def matrix() -> dict[str, Any]:
    return _data.load("compat")


def version_tuple(v: str | None) -> tuple[int, ...]:
    """"6.3.42131-fa1d09cbd" -> (6, 3, 42131); "2.9.1+rocm6.3" -> (2, 9, 1); None -> ()."""
    if not v:
        return ()
    head = re.split(r"[+\-\s]", str(v).strip(), maxsplit=1)[0]
    return tuple(int(x) for x in re.findall(r"\d+", head)[:3])


def major_minor(v: str | None) -> str | None:
    t = version_tuple(v)
    return f"{t[0]}.{t[1]}" if len(t) >= 2 else (f"{t[0]}" if t else None)


def same_series(v: str | None, series: str) -> bool:
    """Does version v belong to series "7.2" (or "3.5")?"""
    a, b = version_tuple(v), version_tuple(series)
    return bool(a) and bool(b) and a[: len(b)] == b


def at_least(v: str | None, series: str) -> bool:
    a, b = version_tuple(v), version_tuple(series)
    return bool(a) and a[: len(b)] >= b


def torch_rocm_from_version(torch_version: str | None) -> str | None:
    """"2.9.1+rocm6.3" -> "6.3" (pip wheels name the ROCm they were built for)."""
    if not torch_version:
        return None
    m = re.search(r"rocm(\d+\.\d+)", torch_version)
    return m.group(1) if m else None


def rocm_supports_gfx906_out_of_the_box(rocm_version: str | None) -> bool | None:
    if not rocm_version:
        return None
    return not at_least(rocm_version, matrix()["rocm"]["tensile_dropped_from"])


@dataclass
class StackMatch:
    id: str
    note: str
    needs: list[str]
    matched: dict[str, bool]

    @property
    def full(self) -> bool:
        return all(self.matched.values())


def match_stacks(rocm: str | None, torch: str | None, torch_hip: str | None, triton: str | None) -> list[StackMatch]:
    """Known-good stacks, best match first (by how many of rocm/torch/torch_hip/triton agree)."""
    out = []
    for s in matrix().get("stacks", []):
        matched = {
            "rocm": same_series(rocm, s["rocm"]) if rocm else False,
            "torch": same_series(torch, s["torch"]) if torch else False,
            "torch_hip": same_series(torch_hip, s["torch_hip"]) if torch_hip else False,
            "triton": same_series(triton, s["triton"]) if triton else False,
        }
        out.append(StackMatch(s["id"], s.get("note", ""), list(s.get("needs", [])), matched))
    out.sort(key=lambda m: -sum(m.matched.values()))
    return out


@dataclass
class KnownBad:
    id: str
    status: str
    reason: str
    fix: str


def known_bad(*, arch: str | None, moe: bool | None = None, quantization: str | None = None,
              bits: int | None = None, dtype: str | None = None, engine: str | None = None) -> list[KnownBad]:
    """The known-bad entries whose every `when` condition holds for these values. A condition on a
    value that is unknown (None) does not hold, except `bits`, which is assumed to match when the
    checkpoint does not say (GPTQ checkpoints are nearly always 4-bit)."""
    values = {"arch": arch, "moe": moe, "quantization": quantization, "bits": bits, "dtype": dtype, "engine": engine}
    hits = []
    for entry in matrix().get("known_bad", []):
        ok = True
        for key, want in entry.get("when", {}).items():
            have = values.get(key)
            if key == "bits" and have is None:
                continue
            if have != want:
                ok = False
                break
        if ok:
            hits.append(KnownBad(entry["id"], entry["status"], entry["reason"], entry["fix"]))
    return hits


def triton_is_gfx906_build(triton_facts: dict[str, Any]) -> bool:
    """A Triton fork built for gfx906: its distribution name/version carries a marker, or its AMD
    backend source names gfx906 (upstream's does not)."""
    markers = [m.lower() for m in matrix()["triton"]["gfx906_markers"]]
    text = f"{triton_facts.get('distribution') or ''} {triton_facts.get('version') or ''}".lower()
    return bool(triton_facts.get("mentions_gfx906")) or any(m in text for m in markers)
