"""Plans for the vLLM tests, built the way resolve() builds them but without touching model files.

plan_from_toml() parses a recipe text with the real schema and fills the Plan fields a resolver
would (the model path as written, GGUF vs HF from the suffix, served name from the file stem)."""

from __future__ import annotations

import tomllib
from pathlib import Path

from g906.recipe.plan import MediaLimitPlan, Plan
from g906.recipe.schema import MediaLimit, Recipe


def _limit(v) -> MediaLimitPlan | None:
    if v is None:
        return None
    if isinstance(v, MediaLimit):
        return MediaLimitPlan(count=v.count, width=v.width, height=v.height)
    return MediaLimitPlan(count=int(v))


def _stem(source: str) -> str:
    name = source.rstrip("/").split("/")[-1]
    for suffix in (".gguf",):
        if name.endswith(suffix):
            name = name[: -len(suffix)]
    return name


def plan_from_recipe(recipe: Recipe, recipe_path: Path | None = None) -> Plan:
    src = recipe.model.source
    if src.startswith("builtin:"):
        fmt, path = "builtin", None
    elif src.endswith(".gguf"):
        fmt, path = "gguf", Path(src)
    elif src.startswith(("/", ".", "~")):
        fmt, path = "hf", Path(src)
    else:                                   # a hub id such as Qwen/Qwen3.5-0.8B
        fmt, path = "hf", None
    mm = {}
    for modality in ("image", "video"):
        lim = _limit(getattr(recipe.multimodal, modality))
        if lim is not None:
            mm[modality] = lim
    return Plan(
        recipe=recipe, recipe_path=recipe_path, model_source=src, model_format=fmt, model_path=path,
        model_files=[path] if path else [], mmproj_path=None,
        served_model_name=recipe.model.name or (src if path is None and fmt == "hf" else _stem(src)),
        quantization="gguf" if fmt == "gguf" else "none", gguf_tensor_types={}, dtype=recipe.model.dtype,
        chat_template_path=None, architecture="qwen35", model_facts={},
        tensor_parallel_size=recipe.parallel.tensor_parallel_size, devices=recipe.parallel.devices,
        rccl_package=None, max_model_len=recipe.limits.max_model_len, max_num_seqs=recipe.limits.max_num_seqs,
        max_num_batched_tokens=recipe.limits.max_num_batched_tokens,
        gpu_memory_utilization=recipe.limits.gpu_memory_utilization, mm_limits=mm,
        engine_kind=recipe.engine.kind, enforce_eager=recipe.engine.enforce_eager,
        reasoning_parser=recipe.engine.reasoning_parser, tool_parser=recipe.server.tool_parser,
        host=recipe.server.host, port=recipe.server.port,
        api_key_env=recipe.server.api_key_env, env=dict(recipe.env),
        speculative=recipe.engine.speculative.config().to_vllm() if recipe.engine.speculative else None,
    )


def plan_from_toml(text: str) -> Plan:
    return plan_from_recipe(Recipe.model_validate(tomllib.loads(text)))


def make_plan(**sections) -> Plan:
    """make_plan(model={"source": "/m/x.gguf"}, server={"port": 9000}, engine={"vllm": {...}})."""
    data = {"model": {"source": "/models/Qwen3.5-0.8B"}}
    data.update(sections)
    data.setdefault("engine", {}).setdefault("kind", "vllm")
    return plan_from_recipe(Recipe.model_validate(data))
