"""Plan -> model, engine, offline LLM and server app: the composition `g906 up`, `g906 bench
--recipe` and scripts share.

    plan = load_and_resolve(Path("recipe.toml"))
    loaded, engine = build_engine(plan)            # LLMEngine (with the vision runtime images need)
    app, state = build_app(plan)                   # the Starlette app; state.set_ready(...) later
    llm = llm_from_plan(plan, num_kv_blocks=64)    # vLLM's offline API over the recipe's model

Nothing here imports torch at module import time: `g906 validate` and `g906 doctor` stay
torch-free, and `g906 up --dry-run` loads nothing."""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from g906.errors import G906Error
from g906.serving.engine_config import engine_config_from_plan, model_args_from_plan
from g906.serving.vision import vision_from_plan

if TYPE_CHECKING:
    from g906.engine.llm import LLM
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sources import LoadedModel
    from g906.recipe.plan import Plan
    from g906.server.app import ServerState


def load_and_resolve(recipe_path: Path) -> Plan:
    """A recipe file, validated and resolved against the file system (errors name file:line:col)."""
    from g906.recipe.load import load_recipe
    from g906.recipe.resolve import resolve

    return resolve(load_recipe(recipe_path), recipe_path)


def load_model_from_plan(plan: Plan, *, dtype: str | None = None, device: str | None = None,
                         progress: bool = True) -> LoadedModel:
    """The plan's model, loaded (split over its tensor-parallel ranks when it asks for them).
    dtype / device: overrides of the plan's."""
    from g906.engine.loader import load_model

    args = model_args_from_plan(plan)
    kw = args.load_kwargs()
    kw["max_model_len"] = plan.max_model_len
    if dtype is not None:
        kw["dtype"] = dtype
    if device is not None:
        kw["device"] = device
    return load_model(args.source, progress=progress, **kw)


def close_model(loaded) -> None:
    """Stop a tensor-parallel model's workers (a no-op for a single-device model)."""
    close = getattr(loaded.model, "close", None) if loaded is not None else None
    if callable(close):
        close()


def build_engine(plan: Plan, *, progress: bool = True, **engine_overrides: Any) -> tuple[LoadedModel, LLMEngine]:
    """load -> vision runtime (when the recipe turns images on) -> engine, its cache sized from
    the budget with the vision tower's peak kept free. engine_overrides: EngineConfig fields."""
    from g906.engine.llm_engine import LLMEngine
    from g906.engine.vision.runtime import reserve_vision_memory

    loaded = load_model_from_plan(plan, progress=progress)
    try:
        if loaded.tokenizer is None:
            raise G906Error(f"{model_args_from_plan(plan).source}: the model has no tokenizer",
                            hint="the server needs tokenizer.json (or GGUF tokenizer metadata)")
        vision = vision_from_plan(plan, loaded)
        with reserve_vision_memory(vision):
            engine = LLMEngine(loaded, engine_config_from_plan(plan, **engine_overrides), vision=vision)
    except BaseException:
        close_model(loaded)
        raise
    return loaded, engine


def llm_from_plan(plan: Plan, *, progress: bool = False, warm_up: bool = False, **engine_overrides: Any) -> LLM:
    """vLLM's offline API (g906.LLM) over a recipe's model, with the recipe's limits.
    engine_overrides: EngineConfig fields (num_kv_blocks=, seed=, enforce_eager=, ...); None
    keeps the recipe's value."""
    from g906.engine.llm import LLM

    args = model_args_from_plan(plan)
    kw = args.load_kwargs()
    kw.pop("keep_mtp", None)          # LLM keeps the MTP block when the config's speculation asks for it
    return LLM.from_config(args.source, engine_config_from_plan(plan, **engine_overrides), progress=progress,
                           warm_up=warm_up, **kw)


def open_recipe_model(recipe_path: Path, *, dtype: str = "auto", device: str | None = None,
                      progress: bool = False) -> tuple[LoadedModel, EngineConfig]:
    """`g906 bench --recipe`: the recipe's model (dtype "auto": the recipe's) and its engine
    limits, with the weight figures the benchmark reports."""
    from g906.bench.offline import add_weight_stats

    plan = load_and_resolve(Path(recipe_path))
    loaded = load_model_from_plan(plan, dtype=None if dtype == "auto" else dtype, device=device, progress=progress)
    return add_weight_stats(loaded), engine_config_from_plan(plan)


# -- the server app ------------------------------------------------------------------------------

def api_key_from_env(plan: Plan) -> str | None:
    """The key the recipe's server.api_key_env names (None: no key); unset or empty is an error."""
    name = plan.api_key_env
    if not name:
        return None
    key = os.environ.get(name)
    if not key:
        raise G906Error(f"the recipe's server.api_key_env names {name}, but {name} is not set (or empty)",
                        hint=f"export {name}=<a secret key>, or remove server.api_key_env to serve without a key")
    return key


def max_body_bytes() -> int:
    """The request body limit: G906_MAX_REQUEST_BYTES, else the server's default."""
    from g906.envvars import positive_env
    from g906.server.app import DEFAULT_MAX_BODY_BYTES

    return positive_env("G906_MAX_REQUEST_BYTES", DEFAULT_MAX_BODY_BYTES, int, "bytes")


def build_app(plan: Plan) -> tuple[Any, ServerState]:
    """The Starlette app for a plan and the state it serves from; /health answers 503 until
    state.set_ready(engine, prompts, info)."""
    from g906.server.app import ServerState, create_app
    from g906.server.cors import add_cors

    from g906.serving.generation_defaults import default_max_tokens

    state = ServerState(served_model_name=plan.served_model_name, reasoning_parser=plan.reasoning_parser,
                        tool_parser=plan.tool_parser, architecture=plan.architecture,
                        api_key=api_key_from_env(plan), max_body_bytes=max_body_bytes(),
                        body_timeout_s=plan.recipe.server.body_timeout_s,
                        max_stored_responses=plan.recipe.server.max_stored_responses,
                        default_max_tokens=default_max_tokens(plan), root_path=plan.root_path,
                        force_include_usage=plan.force_include_usage,
                        per_request_metrics=plan.per_request_metrics)
    app = create_app(state)
    add_cors(app, plan.allowed_origins)
    return app, state
