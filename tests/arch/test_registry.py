"""g906.arch: the architecture registry, torch-free, and the facts it holds."""

from __future__ import annotations

import subprocess
import sys

import pytest

from g906.arch import ARCHITECTURES, HybridShape, for_engine, known_names, lookup
from g906.arch import quant
from g906.arch import qwen35, qwen35moe
from g906.arch.tp import tp_message, valid_tp_sizes
from g906.errors import G906Error

from tests.arch.configs import tiny_config


def test_every_name_finds_its_architecture():
    for arch in ARCHITECTURES:
        for name in arch.names():
            assert lookup(name) is arch
    assert lookup("LlamaForCausalLM") is None and lookup(None) is None
    assert "qwen35" in known_names() and "Qwen3_5MoeForCausalLM" in known_names()


def test_names_are_unique_across_architectures():
    names = [n for a in ARCHITECTURES for n in set(a.names())]
    assert len(names) == len(set(names))


def test_the_engine_refuses_unknown_and_not_yet_embedded_architectures(monkeypatch):
    import dataclasses

    from g906.arch import registry

    assert for_engine("Qwen3_5ForCausalLM", "x").name == "qwen35"
    assert for_engine("qwen35moe", "m.gguf").name == "qwen35moe"
    unrun = dataclasses.replace(qwen35moe.ARCH, model_class=None)
    monkeypatch.setattr(registry, "ARCHITECTURES", (qwen35.ARCH, unrun))
    with pytest.raises(G906Error, match="not run by the embedded engine yet"):
        for_engine("qwen35moe", "m.gguf")
    with pytest.raises(G906Error, match="unknown or unsupported architecture 'llama'"):
        for_engine("llama", "m.gguf")


def test_embedded_architectures_name_an_engine_class_and_their_tables():
    for arch in ARCHITECTURES:
        if arch.embedded:
            assert ":" in arch.model_class
            assert arch.config_from_hf and arch.config_from_gguf and arch.gguf_to_hf and arch.gguf_shapes
            assert arch.tp_counts


def test_the_registry_imports_neither_torch_nor_triton():
    code = ("import sys, g906.arch, g906.arch.tp, g906.arch.quant, g906.arch.hybrid, g906.arch.hf_quant; "
            "print(sorted(m for m in ('torch', 'triton') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


def test_every_gguf_tensor_of_the_table_maps_to_an_hf_name():
    c = tiny_config(num_mtp_layers=1)
    for name in list(qwen35.gguf_shapes(c)) + list(qwen35.gguf_mtp_shapes(c)):
        assert qwen35.gguf_to_hf(name, c) is not None, name
    assert qwen35.gguf_to_hf("blk.0.unknown.weight", c) is None


def test_kv_and_state_bytes():
    c = tiny_config()
    s = HybridShape.of(c)
    n_full, n_lin = len(c.full_attention_layers), len(c.linear_attention_layers)
    assert s.kv_bytes_per_token(2) == n_full * 2 * c.num_key_value_heads * c.head_dim * 2
    conv = (2 * c.linear_num_key_heads * c.linear_key_head_dim
            + c.linear_num_value_heads * c.linear_value_head_dim) * c.linear_conv_kernel_dim * 2
    ssm = c.linear_num_value_heads * c.linear_key_head_dim * c.linear_value_head_dim * 4
    assert s.state_bytes_per_sequence(2) == n_lin * (conv + ssm)
    # each of two ranks holds half the heads
    assert s.kv_bytes_per_token(2, tp=2) * 2 == s.kv_bytes_per_token(2)


def test_tp_counts_come_from_the_architecture():
    c = tiny_config()
    assert valid_tp_sizes(c, limit=4) == [1, 2]
    msg = tp_message(c, 4)
    assert "does not divide" in msg and "KV heads" in msg


def test_quant_table():
    assert quant.block_geometry("Q4_K") == (256, 144)
    assert set(quant.fused_types()) == {"Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"}
    assert set(quant.fused_types()) <= set(quant.quantized_types())
    assert "F16" not in quant.quantized_types()
    with pytest.raises(G906Error, match="IQ1_S is not supported"):
        quant.block_geometry("IQ1_S")


def test_moe_tables_map_every_tensor_and_split_the_experts():
    c = tiny_config(architecture="qwen35moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                    intermediate_size=16, shared_expert_intermediate_size=24, num_mtp_layers=1)
    table = qwen35moe.gguf_shapes(c)
    assert table["blk.0.ffn_gate_exps.weight"] == (8, 16, 32) and table["blk.0.ffn_down_exps.weight"] == (8, 32, 16)
    assert "blk.0.ffn_gate.weight" not in table
    stacked = qwen35moe.gguf_shapes(c, {"blk.0.ffn_gate_up_exps.weight": None})
    assert stacked["blk.1.ffn_gate_up_exps.weight"] == (8, 32, 32) and "blk.1.ffn_up_exps.weight" not in stacked
    for name in list(table) + list(qwen35moe.gguf_mtp_shapes(c)):
        assert qwen35moe.gguf_to_hf(name, c) is not None, name
    assert qwen35moe.gguf_to_hf("blk.4.ffn_down_exps.weight", c) == ("mtp.layers.0.mlp.experts.down_proj", "")
    # tp divides the expert and shared-expert features, not the (absent) dense MLP
    assert valid_tp_sizes(c, limit=8) == [1, 2]
    assert "shared-expert intermediate features" in tp_message(
        tiny_config(architecture="qwen35moe", num_experts=8, num_experts_per_tok=2, moe_intermediate_size=16,
                    shared_expert_intermediate_size=12, num_attention_heads=8, num_key_value_heads=8,
                    linear_num_key_heads=8, linear_num_value_heads=8), 8)


def test_moe_config_from_gguf_metadata():
    md = {"general.architecture": "qwen35moe", "qwen35moe.block_count": 4, "qwen35moe.embedding_length": 32,
          "qwen35moe.attention.head_count": 4, "qwen35moe.attention.head_count_kv": 2,
          "qwen35moe.attention.key_length": 8, "qwen35moe.ssm.time_step_rank": 4, "qwen35moe.ssm.group_count": 2,
          "qwen35moe.ssm.inner_size": 32, "qwen35moe.ssm.conv_kernel": 4, "qwen35moe.ssm.state_size": 8,
          "qwen35moe.expert_count": 8, "qwen35moe.expert_used_count": 2,
          "qwen35moe.expert_feed_forward_length": 16, "qwen35moe.expert_shared_feed_forward_length": 24}
    shapes = {"token_embd.weight": (64, 32), "blk.0.ffn_gate_inp.weight": (8, 32)}
    c = qwen35moe.config_from_gguf(md, shapes, "m.gguf")
    assert (c.num_experts, c.num_experts_per_tok, c.moe_intermediate_size, c.shared_expert_intermediate_size) \
        == (8, 2, 16, 24) and c.norm_topk_prob and c.architecture == "qwen35moe"
    del md["qwen35moe.expert_count"]
    with pytest.raises(G906Error, match="lacks qwen35moe.expert_count"):
        qwen35moe.config_from_gguf(md, shapes, "m.gguf")


def test_moe_hf_config_with_no_architectures_is_read_as_moe():
    from g906.arch import config_from_hf

    cfg = {"model_type": "qwen3_5_moe_text", "vocab_size": 64, "hidden_size": 32, "num_hidden_layers": 4,
           "num_attention_heads": 4, "num_key_value_heads": 2, "num_experts": 8, "num_experts_per_tok": 2,
           "moe_intermediate_size": 16, "linear_num_key_heads": 2, "linear_num_value_heads": 4}
    c = config_from_hf(cfg)
    assert c.architecture == "qwen35moe" and c.shared_expert_intermediate_size == 16
    with pytest.raises(G906Error, match="num_experts_per_tok"):
        config_from_hf({**cfg, "num_experts_per_tok": 9})
