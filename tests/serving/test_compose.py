"""The serving layer: a recipe's Plan becomes the engine's own arguments (ModelArgs,
EngineConfig), an engine, an offline LLM and a server app; the engine never sees the Plan."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from g906.errors import G906Error
from g906.serving import (build_app, build_engine, close_model, engine_config_from_plan, llm_from_plan,
                          load_and_resolve, model_args_from_plan, vision_from_plan)

RECIPE = """
[model]
source = "builtin:tiny-qwen35"
name = "tiny"

[limits]
max_model_len = 256
max_num_seqs = 3
max_num_batched_tokens = 64

[engine]
enforce_eager = true
reasoning_parser = "qwen3"

[engine.embedded]
block_size = 8
cpu_kv_cache_gib = 0.05
max_waiting_requests = 7
prefill_graph_tokens = 32

[server]
api_key_env = "G906_SERVING_TEST_KEY"
"""


@pytest.fixture()
def plan(tmp_path):
    path = tmp_path / "r.toml"
    path.write_text(RECIPE)
    return load_and_resolve(path)


def test_engine_config_carries_the_recipe(plan):
    cfg = engine_config_from_plan(plan)
    assert (cfg.max_num_seqs, cfg.max_num_batched_tokens, cfg.max_model_len) == (3, 64, 256)
    assert (cfg.block_size, cfg.cpu_kv_cache_gib, cfg.max_waiting_requests) == (8, 0.05, 7)
    assert cfg.enforce_eager is True and cfg.prefill_graph_tokens == 32
    over = engine_config_from_plan(plan, num_kv_blocks=40, seed=3, prefill_graph_tokens=None)
    assert (over.num_kv_blocks, over.seed, over.prefill_graph_tokens) == (40, 3, 32)   # None keeps the recipe's
    with pytest.raises(G906Error) as e:
        engine_config_from_plan(plan, max_num_seq=4)
    assert "max_num_seq" in e.value.message and "max_num_seqs" in e.value.hint


def test_model_args(plan):
    args = model_args_from_plan(plan)
    assert args.source == "builtin:tiny-qwen35" and args.tensor_parallel_size == 1
    assert args.load_kwargs() == {"dtype": "auto", "device": None, "devices": None, "tensor_parallel_size": 1,
                                  "chat_template": None}


@pytest.mark.usefixtures("torch_one_thread")
def test_llm_from_plan_runs_the_recipe(plan):
    from g906 import LLM, SamplingParams

    llm = llm_from_plan(plan, num_kv_blocks=24)
    assert isinstance(llm, LLM)
    cfg = llm.engine.config
    assert (cfg.max_num_seqs, cfg.block_size, cfg.num_kv_blocks, cfg.enforce_eager) == (3, 8, 24, True)
    p = SamplingParams(max_tokens=5, temperature=0, ignore_eos=True)
    plain = LLM("builtin:tiny-qwen35", num_kv_blocks=24, block_size=8, max_num_seqs=3)
    assert llm.generate([[4, 5, 6]], p)[0].outputs[0].token_ids == plain.generate([[4, 5, 6]], p)[0].outputs[0].token_ids


@pytest.mark.usefixtures("torch_one_thread")
def test_build_engine_and_app(plan, monkeypatch):
    monkeypatch.delenv("G906_SERVING_TEST_KEY", raising=False)
    with pytest.raises(G906Error) as e:
        build_app(plan)
    assert "G906_SERVING_TEST_KEY" in e.value.message
    monkeypatch.setenv("G906_SERVING_TEST_KEY", "k")
    app, state = build_app(plan)
    assert (state.served_model_name, state.reasoning_parser, state.api_key) == ("tiny", "qwen3", "k")
    assert state.engine is None                     # /health says 503 until set_ready
    loaded, engine = build_engine(plan, progress=False, num_kv_blocks=16)
    try:
        assert engine.vision is None and vision_from_plan(plan, loaded) is None
        assert engine.config.max_waiting_requests == 7 and engine.max_model_len == 256
        assert engine.runner.sizing.num_blocks == 16
    finally:
        close_model(loaded)


def test_serving_and_the_cli_import_no_torch():
    code = ("import sys, g906.serving, g906.cli.app; "
            "bad = [m for m in ('torch', 'triton', 'g906.engine.llm_engine') if m in sys.modules]; "
            "sys.exit(f'imported {bad}' if bad else 0)")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                       cwd=Path(__file__).resolve().parents[2])
    assert r.returncode == 0, r.stderr + r.stdout
