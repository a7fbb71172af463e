"""Tensor parallelism over packed int4/int8 checkpoints: TP=2 (gloo) computes what TP=1 and
transformers (on the dequantized weights) compute, for a GPTQ checkpoint with an 8-bit
per-channel down_proj and 16-bit linear-attention b/a projections (tests/engine's packing); an
act-order checkpoint, whose groups a row-parallel split would break, is refused naming the
tensor (first: a process holds one TP group at a time, and the fixture's lives to the end)."""

from __future__ import annotations

import re

import pytest

from g906.errors import G906Error
from g906.kernels.int4.weight import GroupQuantWeight
from tests.engine.conftest import TinyRunner, build_tiny_qwen35, hf_greedy, random_prompt, rel_err
from tests.engine.hf_quant_writer import write_quantized

from .conftest import TINY_OVERRIDES

BA = re.compile(r".*linear_attn\.in_proj_[ab]$")


def _rules(m):
    if BA.match(m):
        return None
    return (8, -1, False, False) if m.endswith("down_proj") else (4, 32, False, False)


def test_act_order_split_is_refused(tmp_path):
    from g906.engine.parallel import load_model_tp

    hf = build_tiny_qwen35(seed=12, **TINY_OVERRIDES)
    write_quantized(hf, tmp_path, "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
                                           "modules_to_not_convert": ["in_proj_a", "in_proj_b"]},
                    scheme_for=lambda m: None if BA.match(m) else (4, 32, True, True))
    with pytest.raises(G906Error) as e:
        load_model_tp(str(tmp_path), tensor_parallel_size=2, dtype="float32", device="cpu", progress=False)
    assert "cannot be split across 2 ranks" in e.value.message and "act order" in e.value.message


@pytest.fixture(scope="module")
def gptq_pair(tmp_path_factory):
    from g906.engine.loader import load_model
    from g906.engine.parallel import load_model_tp

    hf = build_tiny_qwen35(seed=11, **TINY_OVERRIDES)
    d = tmp_path_factory.mktemp("tp-gptq")
    write_quantized(hf, d, "gptq", {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False,
        "dynamic": {r"-:.*linear_attn\.in_proj_[ab]$": {}, r"+:.*down_proj$": {"bits": 8, "group_size": -1}}},
        scheme_for=_rules)
    ref = load_model(str(d), dtype="float32", device="cpu", progress=False)
    tp = load_model_tp(str(d), tensor_parallel_size=2, dtype="float32", device="cpu", progress=False)
    yield hf, ref, tp
    tp.model.close()


def test_tp2_matches_tp1_and_transformers(gptq_pair):
    hf, ref, tp = gptq_pair
    assert tp.info["quantized_tensors"] == ref.info["quantized_tensors"] > 0
    assert tp.info["weight_bytes"] < ref.info["weight_bytes"]
    assert isinstance(ref.model.model.layers[0].mlp.down_proj.weight, GroupQuantWeight)
    p = [t % ref.config.vocab_size for t in random_prompt(30, 9)]
    a = TinyRunner(ref.model, max_seqs=1).step([0], [p])
    b = TinyRunner(tp.model, max_seqs=1).step([0], [p])
    assert rel_err(b, a) < 1e-5
    assert TinyRunner(tp.model, max_seqs=1).greedy(0, p, 8) == hf_greedy(hf, p, 8)
