"""A server over an engine whose model fails under a running request (fault injected in the
model's forward: the device reports an illegal memory access), for the tests of what each route
answers then."""

from __future__ import annotations

from contextlib import contextmanager

from starlette.testclient import TestClient

from g906.engine.async_engine import AsyncEngine
from g906.engine.llm import PromptBuilder
from g906.server.app import ServerState, create_app
from g906.serving import build_engine, load_and_resolve


@contextmanager
def failing_client(tmp_path):
    """A TestClient of the app over that engine (its lifespan started); the engine shut down after."""
    recipe = tmp_path / "r.toml"
    recipe.write_text('[model]\nsource = "builtin:tiny-qwen35"\n[engine.embedded]\ncpu_kv_cache_gib = 0.01\n')
    loaded, engine = build_engine(load_and_resolve(recipe), progress=False)
    aeng = AsyncEngine(engine)
    aeng.start()
    state = ServerState(served_model_name="tiny-qwen35")
    state.set_ready(aeng, PromptBuilder(loaded.tokenizer, loaded.chat_template))

    def broken_forward(*args, **kwargs):
        raise RuntimeError("HIP error: an illegal memory access was encountered")

    loaded.model.forward = broken_forward
    try:
        with TestClient(create_app(state), raise_server_exceptions=False) as client:
            yield client
    finally:
        aeng.shutdown(drain_timeout=1.0)
