"""What `g906 up SOURCE` serves: a recipe file, or a recipe synthesised from the defaults for a
model given directly, with command-line overrides of recipe keys (vLLM's flag names).

    src = classify("model.gguf")                 # Source(kind="gguf", ...)
    recipe, path = recipe_for(src, {"server.port": 9000, "model.name": "foo"})
    print(recipe_toml(recipe))                   # `g906 up SOURCE --print-recipe`

SOURCE kinds, in the order they are tried: builtin:NAME; an existing path (a directory is a
Hugging Face model folder, a file starting with the GGUF magic is a GGUF model, any other file a
recipe); a Hub id (org/name, org/name:REVISION, org/name:QUANT). A missing *.toml / *.gguf path
is reported as the missing file it is. No torch here."""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from g906.errors import UsageError
from g906.recipe.hub import HubSpec, parse_hub_id
from g906.recipe.scaffold import toml_value
from g906.recipe.schema import Recipe

# command-line flag -> recipe key (section.key): vLLM's `serve` names for the same settings
FLAG_KEYS: dict[str, str] = {
    "--host": "server.host",
    "--port": "server.port",
    "--api-key": "server.api_key_env",
    "--served-model-name": "model.name",
    "--max-model-len": "limits.max_model_len",
    "--max-num-seqs": "limits.max_num_seqs",
    "--tensor-parallel-size": "parallel.tensor_parallel_size",
    "--gpu-memory-utilization": "limits.gpu_memory_utilization",
    "--allowed-origins": "server.allowed_origins",
    "--log-level": "server.log_level",
    "--access-log": "server.access_log",
    "--root-path": "server.root_path",
    "--enable-force-include-usage": "server.force_include_usage",
    "--enable-per-request-metrics": "server.per_request_metrics",
}


@dataclass(frozen=True)
class Source:
    kind: str                          # recipe | gguf | hf | builtin | hub
    text: str                          # as given
    path: Path | None = None           # recipe / gguf / hf
    hub: HubSpec | None = None


def _is_gguf(p: Path) -> bool:
    try:
        with open(p, "rb") as f:
            return f.read(4) == b"GGUF"
    except OSError:
        return False


def classify(text: str) -> Source:
    s = text.strip()
    if not s:
        raise UsageError("SOURCE is empty", hint="give a recipe, a GGUF file, a model folder, org/name or builtin:NAME")
    if s.startswith("builtin:"):
        return Source("builtin", s)
    p = Path(os.path.expanduser(s))
    if p.is_dir():
        if (p / "config.json").is_file():
            return Source("hf", s, path=p)
        inside = sorted(x.name for x in p.glob("*.toml"))[:3] + sorted(x.name for x in p.glob("*.gguf"))[:3]
        raise UsageError(f"{s}: a directory without config.json is not a Hugging Face model folder",
                         hint=("files in it: " + ", ".join(inside)) if inside else
                         "give a recipe, a GGUF file, a model folder (config.json + *.safetensors) or org/name")
    if p.is_file():
        return Source("gguf" if _is_gguf(p) else "recipe", s, path=p)
    spec = parse_hub_id(s)
    if spec is not None and not s.startswith((".", "/", "~")):
        return Source("hub", s, hub=spec)
    if p.suffix.lower() == ".gguf":
        raise UsageError(f"{s}: no such file", hint="give the path of a GGUF file (the first part of a split set)")
    return Source("recipe", s, path=p)      # load_recipe says "no such file", with suggestions


def _set(data: dict, key: str, value: Any) -> None:
    section, _, name = key.rpartition(".")
    node = data
    for part in section.split(".") if section else []:
        node = node.setdefault(part, {})
    node[name] = value


def synthesised_data(src: Source, model_source: str | None = None) -> dict[str, Any]:
    """The recipe data of a model given directly: its source, the rest the defaults."""
    if src.kind == "builtin":
        return {"model": {"source": src.text}}
    if src.kind == "hub":
        return {"model": {"source": str(src.hub)}}
    return {"model": {"source": model_source or str(Path(os.path.abspath(src.path)))}}


def apply_overrides(data: dict[str, Any], overrides: dict[str, Any]) -> dict[str, Any]:
    """data with the overrides (recipe key -> value, None = not given) set; the result is
    validated, a bad value named by its flag."""
    out = _deep_copy(data)
    for key, value in overrides.items():
        if value is not None:
            _set(out, key, value)
    try:
        Recipe.model_validate(out, strict=False)
    except ValidationError as exc:
        flag = {v: k for k, v in FLAG_KEYS.items()}
        for err in exc.errors(include_url=False):
            key = ".".join(str(x) for x in err["loc"] if not str(x).startswith("<"))
            given = next((k for k in overrides if overrides[k] is not None and key.startswith(k)), None)
            if given is not None:
                msg = err["msg"].removeprefix("Value error, ")
                raise UsageError(f"{flag.get(given, given)} {overrides[given]!r}: {msg}",
                                 hint=f"it sets the recipe key {given}; see docs/recipes.md") from None
    return out


def _deep_copy(d: Any) -> Any:
    if isinstance(d, dict):
        return {k: _deep_copy(v) for k, v in d.items()}
    if isinstance(d, list):
        return [_deep_copy(v) for v in d]
    return d


def recipe_toml(data: dict[str, Any], header: str | None = None) -> str:
    """A recipe's data as TOML text (tables in the schema's order; nested tables as [a.b])."""
    order = list(Recipe.model_fields)
    lines: list[str] = [f"# {line}" for line in (header or "").splitlines()]

    def table(name: str, d: dict) -> None:
        scalars = {k: v for k, v in d.items() if not isinstance(v, dict) or name == "env" or _inline(k, v)}
        subs = {k: v for k, v in d.items() if k not in scalars}
        if scalars or not subs:
            if lines:
                lines.append("")
            lines.append(f"[{name}]")
            for k, v in scalars.items():
                if v is not None:
                    lines.append(f"{_key(k)} = {toml_value(v)}")
        for k, v in subs.items():
            table(f"{name}.{k}", v)

    for name in sorted(data, key=lambda k: order.index(k) if k in order else len(order)):
        if isinstance(data[name], dict):
            table(name, data[name])
    return "\n".join(lines) + "\n"


def _inline(key: str, value: dict) -> bool:
    return key in ("image", "video")          # media limits: inline tables, as the docs write them


def _key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_value(k)


def recipe_for(src: Source, overrides: dict[str, Any]) -> tuple[Recipe, dict[str, Any], Path | None]:
    """(the Recipe, its data for --print-recipe, the recipe file or None). A recipe file is read
    and validated with located errors first (g906.recipe.load), then overridden; it keeps its
    text's positions for later messages."""
    if src.kind == "recipe":
        from g906.recipe.load import load_recipe

        loaded = load_recipe(src.path)
        data = apply_overrides(loaded.model_dump(mode="python", exclude_unset=True), overrides)
        if not any(v is not None for v in overrides.values()):
            return loaded, data, src.path
        recipe = Recipe.model_validate(data, strict=False)
        recipe._origin = loaded._origin
        return recipe, data, src.path
    data = apply_overrides(synthesised_data(src), overrides)
    return Recipe.model_validate(data, strict=False), data, None
