"""Serving composition: a resolved recipe Plan becomes what the engine and the server take.
The engine knows only its own EngineConfig and load arguments; the Plan stops here.

    engine_config.py  Plan -> ModelArgs (what to load) and EngineConfig (how to run it)
    vision.py         Plan -> the vision runtime (tower, image limits), or None
    compose.py        Plan -> loaded model, LLMEngine, offline LLM, Starlette app
    serve.py          Plan -> a running HTTP server: bind, load in the background, drain on signals

No torch at import time (the CLI imports this package for every command)."""

from g906.serving.compose import (
    api_key_from_env,
    build_app,
    build_engine,
    close_model,
    llm_from_plan,
    load_and_resolve,
    load_model_from_plan,
    max_body_bytes,
    open_recipe_model,
)
from g906.serving.engine_config import ModelArgs, engine_config_from_plan, model_args_from_plan, model_source
from g906.serving.serve import DRAIN_TIMEOUT, DrainingServer, base_url, bind, curl_example, serve_plan, stop_all
from g906.serving.vision import vision_from_plan

__all__ = [
    "DRAIN_TIMEOUT", "DrainingServer", "ModelArgs", "api_key_from_env", "base_url", "bind", "build_app",
    "build_engine", "close_model", "curl_example", "engine_config_from_plan", "llm_from_plan", "load_and_resolve",
    "load_model_from_plan", "max_body_bytes", "model_args_from_plan", "model_source", "open_recipe_model",
    "serve_plan", "stop_all", "vision_from_plan",
]
