"""Synthetic real-shape models: shapes as data, valid random quantized blocks, the Q4_K_M mix,
bytes read per token (against the figures the issue derives from llama.cpp's files)."""

from __future__ import annotations

import pytest
import torch

from g906.bench.synthetic import build_synthetic, weight_stats
from g906.engine.synthetic import QuantPlan, parse_overrides, random_blocks, shape_config, shape_names
from g906.engine.quant.dequant import block_geometry, dequantize
from g906.errors import UsageError

TINY = dict(num_hidden_layers=4, hidden_size=256, intermediate_size=512, vocab_size=1024,
            num_attention_heads=2, num_key_value_heads=1, linear_num_key_heads=2, linear_num_value_heads=4,
            linear_key_head_dim=32, linear_value_head_dim=32, head_dim=64)


def test_shapes_are_data():
    assert shape_names() == ["qwen3.5-0.8b", "qwen3.5-2b", "qwen3.5-4b", "qwen3.5-9b", "qwen3.5-27b",
                             "qwen3.5-35b-a3b"]
    c = shape_config("qwen3.5-9b")
    assert (c.hidden_size, c.intermediate_size, c.num_hidden_layers, c.vocab_size) == (4096, 12288, 32, 248320)
    assert (c.num_attention_heads, c.num_key_value_heads, c.head_dim) == (16, 4, 256)
    assert (c.linear_num_key_heads, c.linear_num_value_heads) == (16, 32)
    assert c.full_attention_layers == [3, 7, 11, 15, 19, 23, 27, 31]
    assert shape_config("qwen3.5-0.8b").tie_word_embeddings and not c.tie_word_embeddings
    with pytest.raises(UsageError, match="unknown model shape"):
        shape_config("qwen3.5-7b")
    assert parse_overrides(["num_hidden_layers=4", "tie_word_embeddings=false", "rms_norm_eps=1e-5"]) == {
        "num_hidden_layers": 4, "tie_word_embeddings": False, "rms_norm_eps": 1e-5}
    with pytest.raises(UsageError):
        parse_overrides(["oops"])


@pytest.mark.parametrize("qtype", ["Q8_0", "Q4_K", "Q5_K", "Q6_K"])
def test_random_blocks_are_valid(qtype):
    g = torch.Generator().manual_seed(1)
    cols = 1024
    raw = random_blocks(qtype, 96, cols, g=g, device="cpu")
    block, nbytes = block_geometry(qtype)
    assert raw.dtype == torch.uint8 and raw.shape == (96, cols // block * nbytes)
    w = dequantize(raw, qtype, (96, cols))
    assert torch.isfinite(w).all()
    assert abs(float(w.mean())) < 0.1 / cols ** 0.5
    assert 0.8 < float(w.std()) * cols ** 0.5 < 1.25
    # the f16 scales themselves are finite and small
    d = raw.reshape(96, -1, nbytes)
    off = {"Q8_0": 0, "Q4_K": 0, "Q5_K": 0, "Q6_K": 208}[qtype]
    scale = d[..., off:off + 2].contiguous().view(torch.float16).float()
    assert torch.isfinite(scale).all() and float(scale.abs().max()) < 1e-2


def _matrix_bytes(shape: str, quant: str) -> tuple[int, int]:
    """(file-size-like total, bytes per decode token) of the 2-D matrices, without building."""
    c = shape_config(shape)
    plan = QuantPlan(quant, c)
    H, I = c.hidden_size, c.intermediate_size
    nk, nv, dk, dv = c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim, c.linear_value_head_dim
    mats = [("model.embed_tokens.weight", c.vocab_size, H)]
    for i, kind in enumerate(c.layer_types):
        p = f"model.layers.{i}."
        if kind == "linear_attention":
            mats += [(p + "linear_attn.in_proj_qkv.weight", 2 * nk * dk + nv * dv, H),
                     (p + "linear_attn.in_proj_z.weight", nv * dv, H), (p + "linear_attn.in_proj_b.weight", nv, H),
                     (p + "linear_attn.in_proj_a.weight", nv, H), (p + "linear_attn.out_proj.weight", H, nv * dv)]
        else:
            hd = c.head_dim
            mats += [(p + "self_attn.q_proj.weight", 2 * c.num_attention_heads * hd, H),
                     (p + "self_attn.k_proj.weight", c.num_key_value_heads * hd, H),
                     (p + "self_attn.v_proj.weight", c.num_key_value_heads * hd, H),
                     (p + "self_attn.o_proj.weight", H, c.num_attention_heads * hd)]
        mats += [(p + "mlp.gate_proj.weight", I, H), (p + "mlp.up_proj.weight", I, H), (p + "mlp.down_proj.weight", H, I)]
    if not c.tie_word_embeddings:
        mats.append(("lm_head.weight", c.vocab_size, H))
    total = emb = 0
    for name, rows, cols in mats:
        qt = plan.qtype(name, cols)
        b = rows * cols * 2 if qt is None else rows * cols // block_geometry(qt)[0] * block_geometry(qt)[1]
        total += b
        if "embed_tokens" in name:
            emb = b
    per_token = total - emb + (emb if c.tie_word_embeddings else 0)
    return total, per_token


def test_sizes_match_llama_cpp_files_and_limits():
    # the issue: llama.cpp's 9B files are 17.9 / 9.5 / 5.6 GB; at 4.22 TB/s the per-token bytes give
    # decode limits of about 265 / 500 / 835 tok/s
    for quant, size_gb, limit in (("f16", 17.9, 265), ("q8_0", 9.5, 500), ("q4_k", 5.6, 835)):
        total, per_token = _matrix_bytes("qwen3.5-9b", quant)
        assert abs(total / 1e9 - size_gb) < 0.15, (quant, total)
        assert abs(4.22e12 / per_token - limit) / limit < 0.02, (quant, per_token)
    total, _ = _matrix_bytes("qwen3.5-0.8b", "f16")
    assert abs(total / 1e9 - 1.5) < 0.1


def test_q4_k_m_mix():
    c = shape_config("qwen3.5-9b")
    plan = QuantPlan("q4_k", c)
    v = [plan.qtype(f"model.layers.{i}.self_attn.v_proj.weight", 4096) for i in c.full_attention_layers]
    assert v == ["Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q4_K", "Q4_K", "Q6_K", "Q6_K"]
    down = [plan.qtype(f"model.layers.{i}.mlp.down_proj.weight", 12288) for i in range(32)]
    assert down[:4] == ["Q6_K"] * 4 and down[-4:] == ["Q6_K"] * 4 and down.count("Q6_K") == 16
    assert plan.qtype("lm_head.weight", 4096) == "Q6_K"
    assert plan.qtype("model.layers.0.linear_attn.in_proj_qkv.weight", 4096) == "Q5_K"
    assert plan.qtype("model.layers.0.mlp.gate_proj.weight", 4096) == "Q4_K"
    assert plan.qtype("model.layers.0.mlp.gate_proj.weight", 96) == "Q8_0"      # not whole super-blocks
    assert plan.qtype("model.layers.0.mlp.gate_proj.weight", 40) is None         # not even Q8_0 blocks
    assert QuantPlan("f16", c).qtype("lm_head.weight", 4096) is None


@pytest.mark.parametrize("quant", ["f16", "q8_0", "q4_k"])
def test_build_runs_and_counts_bytes(quant):
    lm = build_synthetic("qwen3.5-0.8b", quant=quant, device="cpu", overrides=TINY)
    info = lm.info
    assert info["synthetic"] and info["quant"] == quant
    ws = weight_stats(lm.model)
    assert ws["bytes_per_token"] == info["bytes_per_token"]
    # tied: the LM head reads the whole table, so only the embedding's one-row read is extra
    assert ws["bytes_per_token"] == ws["weight_bytes"] + ws["embedding_bytes"] // 1024
    if quant != "f16":
        assert info["quantized_tensors"] > 0
    # deterministic: same seed, same weights
    again = build_synthetic("qwen3.5-0.8b", quant=quant, device="cpu", overrides=TINY)
    a = lm.model.model.layers[0].mlp.down_proj.weight
    b = again.model.model.layers[0].mlp.down_proj.weight
    a, b = (getattr(a, "data", a), getattr(b, "data", b))
    assert torch.equal(a, b)
    # the model computes finite logits
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sampling_params import SamplingParams

    eng = LLMEngine(lm, EngineConfig(max_num_seqs=2, max_model_len=64, num_kv_blocks=8))
    eng.add_request("a", list(range(100, 120)), SamplingParams(temperature=0, max_tokens=4, ignore_eos=True))
    toks = []
    while eng.has_unfinished_requests():
        for out in eng.step():
            toks += out.new_token_ids
    assert len(toks) == 4 and all(0 <= t < 1024 for t in toks)


def test_moe_shape_and_its_active_bytes():
    c = shape_config("qwen3.5-35b-a3b")
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size) \
        == (256, 8, 512, 512) and c.architecture == "qwen35moe" and c.num_hidden_layers == 40
    moe_tiny = dict(TINY, num_experts=16, num_experts_per_tok=4, intermediate_size=256, moe_intermediate_size=256,
                    shared_expert_intermediate_size=256)
    lm = build_synthetic("qwen3.5-35b-a3b", quant="q4_k", device="cpu", overrides=moe_tiny)
    experts = lm.model.model.layers[0].mlp.experts
    assert experts.gate_up.qtype == "Q4_K" and experts.down_proj.qtype in ("Q4_K", "Q6_K")
    ws = weight_stats(lm.model)
    # 16 experts x (2 x 256 + 256 rows) x 256 / 256 x 144 bytes in each of 4 layers, but one is
    # Q6_K (use_more_bits): count from the weights themselves
    eb = sum(t.nbytes for layer in lm.model.model.layers
             for t in (layer.mlp.experts.gate_up, layer.mlp.experts.down_proj))
    assert ws["expert_bytes"] == eb
    assert ws["bytes_per_token"] == ws["weight_bytes"] - ws["embedding_bytes"] + ws["embedding_bytes"] // 1024 \
        - (eb - eb * 4 // 16)


def test_untied_bytes_exclude_embedding():
    lm = build_synthetic("qwen3.5-9b", quant="f16", device="cpu",
                         overrides=dict(TINY, tie_word_embeddings=False))
    ws = weight_stats(lm.model)
    assert ws["bytes_per_token"] == ws["weight_bytes"] - ws["embedding_bytes"] + ws["embedding_bytes"] // 1024


def test_bad_quant():
    with pytest.raises(UsageError, match="unknown --quant"):
        build_synthetic("qwen3.5-0.8b", quant="q3_k", device="cpu", overrides=TINY)
