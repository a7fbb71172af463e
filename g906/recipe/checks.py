"""Cross-field rules: what no single key's type can say.

cross_field_problems() reads the recipe as plain data (the parsed TOML, or a Recipe's
model_dump()) and guards every type itself, so the loader can run it even when other keys
failed validation and report every problem at once. Each problem is
(key path, message, help or None); the path names the key to point at.
"""

from __future__ import annotations

import re
from typing import Any, NamedTuple

from g906.recipe import registry
from g906.recipe.tokens import parse_token_count


class Problem(NamedTuple):
    path: tuple
    message: str
    help: str | None = None
    at: str = "value"  # point at the key's "value" or at the "key" itself

_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def _table(data: Any, key: str) -> dict:
    v = data.get(key) if isinstance(data, dict) else None
    return v if isinstance(v, dict) else {}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _media_count(v: Any) -> int | None:
    if _is_int(v):
        return v
    if isinstance(v, dict) and _is_int(v.get("count")):
        return v["count"]
    return None


def cross_field_problems(data: Any) -> list[Problem]:
    out: list[Problem] = []
    model = _table(data, "model")
    parallel = _table(data, "parallel")
    multimodal = _table(data, "multimodal")
    engine = _table(data, "engine")

    # -- parallel -------------------------------------------------------------
    devices = parallel.get("devices")
    tp = parallel.get("tensor_parallel_size", 1)
    if isinstance(devices, list) and all(_is_int(d) for d in devices):
        seen: set[int] = set()
        for i, d in enumerate(devices):
            if d in seen:
                out.append(
                    Problem(("parallel", "devices", i), f"GPU {d} is listed twice in parallel.devices",
                     "each GPU can hold one tensor-parallel rank; list distinct indices")
                )
            seen.add(d)
        if _is_int(tp) and tp >= 1 and len(devices) != tp and len(set(devices)) == len(devices):
            where = "is" if "tensor_parallel_size" in parallel else "defaults to"
            out.append(
                Problem(("parallel", "devices"),
                 f"parallel.devices lists {len(devices)} GPU{'s' if len(devices) != 1 else ''} but "
                 f"parallel.tensor_parallel_size {where} {tp}",
                 f"set tensor_parallel_size = {len(devices)}, or list {tp} device{'s' if tp != 1 else ''}")
            )

    # -- limits -----------------------------------------------------------------
    limits = _table(data, "limits")
    seqs = limits.get("max_num_seqs", 16)
    try:
        mbt = parse_token_count(limits["max_num_batched_tokens"]) if limits.get("max_num_batched_tokens") is not None else None
    except ValueError:
        mbt = None                              # the field's own check names it
    if mbt is not None and mbt >= 1 and _is_int(seqs) and seqs >= 1 and mbt < seqs:
        where = "is" if "max_num_seqs" in limits else "defaults to"
        out.append(
            Problem(("limits", "max_num_batched_tokens"),
                    f"limits.max_num_batched_tokens ({mbt}) is below limits.max_num_seqs, which {where} {seqs}: "
                    "a decode step of every running sequence takes one token each",
                    f"set max_num_batched_tokens to at least {seqs}, or max_num_seqs to at most {mbt}")
        )

    # -- env --------------------------------------------------------------------
    env = data.get("env") if isinstance(data, dict) else None
    if isinstance(env, dict):
        for key in env:
            if not _ENV_NAME.fullmatch(str(key)):
                out.append(
                    Problem(("env", key), f"{key!r} is not a valid environment variable name",
                            "use letters, digits and underscores, not starting with a digit", at="key")
                )

    # -- multimodal -------------------------------------------------------------
    for kind in ("image", "video"):
        lim = multimodal.get(kind)
        if isinstance(lim, dict):
            has_w, has_h = lim.get("width") is not None, lim.get("height") is not None
            if has_w != has_h:
                missing = "height" if has_w else "width"
                present = "width" if has_w else "height"
                out.append(
                    Problem(("multimodal", kind, present), f"multimodal.{kind} sets {present} but not {missing}",
                     "give both, e.g. { count = 1, width = 512, height = 512 }, or neither")
                )

    source = model.get("source")
    source = source.strip() if isinstance(source, str) else None
    builtin = source is not None and source.startswith("builtin:")
    is_gguf = source is not None and not builtin and source.lower().endswith(".gguf")
    media_on = [k for k in ("image", "video") if (_media_count(multimodal.get(k)) or 0) > 0]

    if builtin:
        name = source[len("builtin:"):]
        entry = registry.builtin_entry(name) or {}
        if media_on and not entry.get("multimodal", False):
            for k in media_on:
                out.append(
                    Problem(("multimodal", k), f"multimodal.{k} enables {k}s but the builtin model {name!r} is text-only",
                     f"remove multimodal.{k} or set it to 0")
                )
        if engine.get("kind") == "vllm":
            out.append(
                Problem(("engine", "kind"), "engine.kind = \"vllm\" cannot serve a builtin synthetic model",
                 "use the embedded engine (engine.kind = \"embedded\") or a real model source")
            )
        if model.get("quantization") in ("gguf", "gptq", "awq", "compressed-tensors"):
            out.append(
                Problem(("model", "quantization"),
                 f"model.quantization = {model['quantization']!r} does not apply to a builtin model",
                 "remove it (or use \"auto\")")
            )
        mmproj = model.get("mmproj")
        if isinstance(mmproj, str) and mmproj not in ("auto", "none"):
            out.append(Problem(("model", "mmproj"), "a builtin model has no vision projector", "remove model.mmproj"))

    if is_gguf:
        q = model.get("quantization")
        if q in ("gptq", "awq", "compressed-tensors", "none"):
            out.append(
                Problem(("model", "quantization"), f"model.quantization = {q!r} contradicts a GGUF source",
                 "a GGUF file carries its own quantization: use \"auto\" or \"gguf\"")
            )
        if model.get("mmproj") == "none":
            for k in media_on:
                out.append(
                    Problem(("multimodal", k), f"multimodal.{k} enables {k}s but model.mmproj = \"none\"",
                     f"set model.mmproj to \"auto\" or the projector's path, or set multimodal.{k} = 0")
                )
    return out
