"""transformers on the synthetic model's weights (the side-by-side ratio's other side) computes
what g906 computes."""

from __future__ import annotations

import pytest
import torch

from g906.bench.hf import build_hf_model, hf_generate_bench
from g906.bench.synthetic import build_synthetic
from g906.engine.synthetic import shape_config
from g906.engine.cache import ModelCache
from g906.engine.context import ForwardContext

from .test_synthetic import TINY


@pytest.mark.parametrize("tie", [True, False])
def test_hf_model_has_the_same_weights(tie):
    ov = dict(TINY, tie_word_embeddings=tie)
    c = shape_config("qwen3.5-0.8b", ov)
    hf = build_hf_model(c, device="cpu", dtype=torch.float32)
    lm = build_synthetic("qwen3.5-0.8b", quant="f32", device="cpu", overrides=ov)
    ids = list(range(100, 130))
    with torch.no_grad():
        ref = hf(input_ids=torch.tensor([ids]), use_cache=False).logits[0, -1].float()
    cache = ModelCache.allocate(c, num_blocks=4, block_size=16, num_state_slots=1, dtype=torch.float32,
                                device="cpu")
    lm.model.bind_cache(cache)
    n = len(ids)
    i32 = dict(dtype=torch.int32)
    ctx = ForwardContext(True, torch.tensor([0, n], **i32), torch.tensor([n], **i32), torch.tensor([0], **i32),
                         torch.arange(n), torch.arange(4, **i32)[None], torch.tensor([0], **i32),
                         torch.tensor([False]), n, n)
    got = lm.model.compute_logits(lm.model.forward(torch.tensor(ids), torch.arange(n), ctx)[-1:])[0]
    torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
    if not tie:
        res = hf_generate_bench(hf, prompt_len=8, new_tokens=3)
        assert res["prefill_tok_s"] > 0 and res["decode_tok_s"] > 0


@pytest.mark.parametrize("tie", [True, False])
def test_weight_bytes_equal_transformers_parameter_bytes(tie):
    """weight_stats counts every weight the model holds (fused ones kept as plain attributes
    too): the same bytes as transformers' parameters of the same shape, at fp32."""
    from g906.bench.synthetic import weight_stats

    ov = dict(TINY, tie_word_embeddings=tie)
    c = shape_config("qwen3.5-0.8b", ov)
    with torch.device("meta"):
        from transformers import Qwen3_5ForCausalLM

        from g906.bench.hf import hf_text_config

        hf = Qwen3_5ForCausalLM(hf_text_config(c))
    hf_bytes = sum(p.numel() for p in hf.parameters()) * 4      # tied: counted once
    lm = build_synthetic("qwen3.5-0.8b", quant="f32", device="cpu", overrides=ov)
    ws = weight_stats(lm.model)
    assert ws["weight_bytes"] == hf_bytes
    emb = c.vocab_size * c.hidden_size * 4
    read = hf_bytes - emb + c.hidden_size * 4 + (emb if tie else 0)
    assert ws["bytes_per_token"] == read
