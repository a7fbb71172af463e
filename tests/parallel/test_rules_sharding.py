"""Sharding rules without processes: TP-size rules (shared with the recipe resolver), head index
sets for grouped and tiled value-head orders, and quantized splits along rows and columns."""

from __future__ import annotations


import pytest
import torch

from g906.arch.config import ModelConfig
from g906.engine.layers.reference import kv_head_index
from g906.arch.tp import check_tp_size, tp_message, tp_problems, valid_tp_sizes
from g906.engine.parallel.sharding import (
    linear_k_heads, linear_qkv_rows, linear_v_heads, local_config, shard_plan, take, vocab_range,
)
from g906.engine.weights import QuantizedTensor
from g906.errors import G906Error


def cfg(**over) -> ModelConfig:
    kw = dict(vocab_size=1000, hidden_size=64, intermediate_size=256, num_hidden_layers=4, num_attention_heads=8,
              num_key_value_heads=4, head_dim=16, linear_num_key_heads=4, linear_num_value_heads=12,
              linear_key_head_dim=8, linear_value_head_dim=32)
    kw.update(over)
    return ModelConfig(**kw)


def test_tp_problems_name_the_counts():
    c = cfg()
    assert tp_problems(c, 1) == [] and tp_problems(c, 2) == [] and tp_problems(c, 4) == []
    msgs = tp_problems(c, 3)
    assert any("num_attention_heads = 8" in m for m in msgs)
    assert any("KV heads (num_key_value_heads = 4)" in m for m in msgs)
    assert any("linear_num_key_heads = 4" in m for m in msgs)
    assert not any("linear_num_value_heads" in m for m in msgs)     # 12 % 3 == 0
    assert valid_tp_sizes(c) == [1, 2, 4]
    with pytest.raises(G906Error) as e:
        check_tp_size(c, 8)
    assert e.value.message == ("tensor_parallel_size 8 does not divide the model's 4 KV heads (num_key_value_heads), "
                               "4 linear-attention key heads (linear_num_key_heads), 12 linear-attention value heads "
                               "(linear_num_value_heads)")
    assert "1, 2, 4" in e.value.hint
    assert tp_message(c, 2) is None
    assert tp_message(cfg(num_key_value_heads=2), 4) == (
        "tensor_parallel_size 4 does not divide the model's 2 KV heads (num_key_value_heads = 2)")


def test_tp_problems_from_recipe_facts():
    hf = {"num_attention_heads": 24, "num_key_value_heads": 4, "linear_num_key_heads": 16,
          "linear_num_value_heads": 48, "intermediate_size": 17408}
    assert tp_problems(hf, 2) == [] and tp_problems(hf, 4) == []
    (only,) = tp_problems(hf, 8)                 # only the 4 KV heads do not split 8 ways
    assert "(num_key_value_heads = 4)" in only
    gguf = {"num_attention_heads": 24, "num_key_value_heads": 4, "gguf": {"ssm.group_count": 16,
                                                                          "ssm.time_step_rank": 48}}
    assert any("linear_num_key_heads = 16" in m for m in tp_problems(gguf, 3))
    assert tp_problems({}, 3) == []               # nothing known: nothing to say


@pytest.mark.parametrize("order", ["grouped", "tiled"])
@pytest.mark.parametrize("tp", [1, 2, 4])
def test_value_heads_follow_their_key_heads(order, tp):
    c = cfg(linear_v_head_order=order)
    nk, nv = c.linear_num_key_heads, c.linear_num_value_heads
    glob = kv_head_index(nv, nk, order)
    seen = []
    for r in range(tp):
        ks, vs = linear_k_heads(c, r, tp), linear_v_heads(c, r, tp)
        seen += vs
        # every value head of the rank uses one of the rank's key heads...
        assert {int(glob[j]) for j in vs} <= set(ks)
        # ...and the local layout is again `order` for the local counts
        loc = kv_head_index(len(vs), len(ks), order)
        assert [ks[int(i)] for i in loc] == [int(glob[j]) for j in vs]
    assert sorted(seen) == list(range(nv))


def test_tiled_value_heads_are_not_contiguous():
    c = cfg(linear_v_head_order="tiled")
    assert linear_v_heads(c, 0, 2) == [0, 1, 4, 5, 8, 9]
    assert linear_v_heads(c, 1, 2) == [2, 3, 6, 7, 10, 11]
    rows = linear_qkv_rows(c, 1, 2)
    key_dim = 4 * 8
    assert rows[:16] == list(range(16, 32))                        # q of key heads 2, 3
    assert rows[16:32] == list(range(key_dim + 16, key_dim + 32))  # k of key heads 2, 3
    assert rows[32:96] == list(range(2 * key_dim + 2 * 32, 2 * key_dim + 4 * 32))   # v heads 2, 3
    assert rows[96:160] == list(range(2 * key_dim + 6 * 32, 2 * key_dim + 8 * 32))  # v heads 6, 7


def test_local_config_and_plans():
    c = cfg()
    loc = local_config(c, 2)
    assert (loc.num_attention_heads, loc.num_key_value_heads, loc.linear_num_key_heads,
            loc.linear_num_value_heads, loc.intermediate_size) == (4, 2, 2, 6, 128)
    assert loc.vocab_size == c.vocab_size and loc.linear_conv_dim == 2 * 2 * 8 + 6 * 32
    kind, idx = shard_plan("model.language_model.layers.3.self_attn.q_proj.weight", c, 1, 2)
    assert kind == "rows" and idx == list(range(4 * 32, 8 * 32))   # [q | gate] = 2 * head_dim rows a head
    assert shard_plan("model.layers.3.self_attn.o_proj.weight", c, 1, 2) == ("cols", list(range(64, 128)))
    assert shard_plan("model.layers.0.mlp.down_proj.weight", c, 0, 2) == ("cols", list(range(128)))
    assert shard_plan("model.layers.0.input_layernorm.weight", c, 0, 2) == ("replicate", None)
    assert shard_plan("model.layers.0.self_attn.q_norm.weight", c, 1, 2) == ("replicate", None)
    assert shard_plan("model.norm.weight", c, 1, 2) == ("replicate", None)
    assert vocab_range(1000, 0, 3) == (0, 334) and vocab_range(1000, 2, 3) == (668, 1000)
    assert shard_plan("lm_head.weight", c, 2, 3) == ("rows", list(range(668, 1000)))
    with pytest.raises(G906Error, match="no tensor-parallel sharding rule"):
        shard_plan("model.layers.0.mlp.experts.0.weight", c, 0, 2)


def _q8_0(rows: int, cols: int, seed: int = 0) -> tuple[QuantizedTensor, torch.Tensor]:
    from tests.engine.gguf_writer import quantize
    from g906.engine.quant.dequant import dequantize

    x = torch.randn(rows, cols, generator=torch.Generator().manual_seed(seed))
    raw = torch.from_numpy(quantize(x.numpy(), "Q8_0"))
    q = QuantizedTensor(raw, "Q8_0", (rows, cols))
    return q, dequantize(q.data, q.qtype, q.shape)


def test_quantized_rows_and_whole_block_columns():
    from g906.engine.quant.dequant import dequantize

    q, dense = _q8_0(6, 128)
    rows = take("w", q, "rows", [1, 4, 5], 2)
    assert torch.equal(dequantize(rows.data, "Q8_0", rows.shape), dense[[1, 4, 5]])
    cols = list(range(32, 64)) + list(range(96, 128))     # whole 32-value blocks, not contiguous
    part = take("w", q, "cols", cols, 2)
    assert part.shape == (6, 64)
    assert torch.equal(dequantize(part.data, "Q8_0", part.shape), dense[:, cols])


def test_quantized_columns_off_block_boundaries_are_refused():
    q, _ = _q8_0(4, 64)
    with pytest.raises(G906Error) as e:
        take("model.layers.0.linear_attn.out_proj.weight", q, "cols", list(range(0, 16)) + list(range(32, 48)), 2)
    msg = e.value.message
    assert "out_proj.weight" in msg and "Q8_0" in msg and "32 values per block" in msg and "0..15" in msg


def test_dense_split_is_a_view_when_contiguous():
    w = torch.randn(8, 6)
    part = take("w", w, "rows", [2, 3, 4], 2)
    assert part.data_ptr() == w[2].data_ptr()
    assert torch.equal(take("w", w, "cols", [0, 5], 2), w[:, [0, 5]])
