"""Qwen3.5 MoE at TP=2 (gloo, two processes): experts split along their intermediate features,
one all-reduce per MoE layer. Greedy outputs equal transformers' (HF checkpoint) and the
TP=1 engine's (GGUF Q8_0 experts, kept quantized and split by whole blocks); a K-quant whose
per-rank share is not whole super-blocks is refused with the tensor named."""

from __future__ import annotations

import pytest
import torch

from g906.errors import G906Error
from tests.engine.conftest import TinyRunner, build_tiny_qwen35moe, hf_greedy, hf_logits, random_prompt, rel_err


@pytest.fixture(scope="module")
def moe_model():
    return build_tiny_qwen35moe(seed=6)


@pytest.fixture(scope="module")
def moe_sources(moe_model, tmp_path_factory):
    from tests.engine.gguf_writer import write_gguf

    d = tmp_path_factory.mktemp("tp-moe")
    moe_model.save_pretrained(d / "hf")
    return {"hf": str(d / "hf"),
            "gguf-q8_0": str(write_gguf(moe_model, d / "moe-Q8_0.gguf", qtype="Q8_0", strict=True)[0]),
            "gguf-q4_k": str(write_gguf(moe_model, d / "moe-Q4_K.gguf", qtype="Q8_0",
                                        type_overrides={"blk.2.ffn_down_exps.weight": "Q4_K"})[0])}


def _tp(src):
    from g906.engine.parallel import load_model_tp

    return load_model_tp(src, tensor_parallel_size=2, dtype="float32", device="cpu", progress=False)


def test_hf_tp2_greedy_equals_transformers(moe_sources, moe_model):
    tp = _tp(moe_sources["hf"])
    try:
        local = tp.model.config
        assert local.moe_intermediate_size == 128 and local.shared_expert_intermediate_size == 128
        assert local.num_experts == 16
        runner = TinyRunner(tp.model, max_seqs=2, max_len=128)
        for n, seed in ((9, 1), (40, 2)):
            p = random_prompt(n, seed)
            runner.release(0)
            got = runner.step([0], [p])[0]
            assert rel_err(got, hf_logits(moe_model, p)[-1]) < 1e-4
            assert runner.greedy(1, p, 8) == hf_greedy(moe_model, p, 8)
    finally:
        tp.model.close()


def test_gguf_q8_0_tp2_matches_tp1(moe_sources):
    from g906.engine.loader import load_model

    src = moe_sources["gguf-q8_0"]
    ref = load_model(src, dtype="float32", device="cpu", progress=False)
    tp = _tp(src)
    try:
        assert tp.info["quantized_tensors"] > 0 and tp.info["weight_bytes"] < ref.info["weight_bytes"]
        r1, r2 = TinyRunner(ref.model, max_seqs=1, max_len=96), TinyRunner(tp.model, max_seqs=1, max_len=96)
        p = random_prompt(30, 3)
        assert rel_err(r2.step([0], [p]), r1.step([0], [p])) < 1e-5
        assert r2.greedy(0, p, 10) == r1.greedy(0, p, 10)
    finally:
        tp.model.close()


def test_k_quant_experts_that_do_not_split_on_whole_blocks_are_refused(moe_sources):
    with pytest.raises(G906Error, match=r"layers\.2\.mlp\.experts\.down_proj \(Q4_K"):
        _tp(moe_sources["gguf-q4_k"]).model.close()
