"""Tensor parallelism over int4 MoE checkpoints (gloo, two processes): each rank takes every
expert's gate/up rows and down_proj input features at group boundaries (the tests' own GPTQ and
compressed-tensors packing, one module per expert; the shared expert quantized too or not) and computes what TP=1 and
transformers (on the dequantized weights) compute. Act-order experts, whose down_proj groups a
split would break, are refused naming the expert's tensor (first: a process holds one TP group
at a time, and the fixture's lives to the end)."""

from __future__ import annotations

import re

import pytest

from g906.errors import G906Error
from g906.kernels.int4.experts import GroupQuantExperts
from tests.engine.conftest import build_tiny_qwen35moe
from tests.engine.hf_quant_writer import write_quantized
from tests.parallel.conftest import assert_tp_matches_tp1_and_hf

BA = re.compile(r".*linear_attn\.in_proj_[ab]$")
EXPERT = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj$")
EXPERTS_ONLY = {r"-:.*shared_expert.*": {}, r"-:.*\.(self_attn|linear_attn)\..*": {}}


def _tp(src):
    from g906.engine.parallel import load_model_tp

    return load_model_tp(src, tensor_parallel_size=2, dtype="float32", device="cpu", progress=False)


def test_act_order_experts_are_refused(tmp_path):
    hf = build_tiny_qwen35moe(seed=31)
    write_quantized(hf, tmp_path, "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": True,
                                           "dynamic": EXPERTS_ONLY},
                    scheme_for=lambda m: (4, 32, True, True) if EXPERT.match(m) else None)
    with pytest.raises(G906Error) as e:
        _tp(str(tmp_path)).model.close()
    msg = e.value.message
    assert re.search(r"mlp\.experts\.\d+\.down_proj\.weight \(int4 g32 sym act-order\) cannot be split across 2 ranks",
                     msg) and "act order" in msg


CASES = {
    # experts asymmetric int4 g32 (a rank's 128 expert features = 4 groups); the shared expert's
    # down_proj 8-bit per-channel; the router and the shared expert's gate 16-bit
    "gptq-asym-g32": ("gptq", {
        "quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": False,
        "dynamic": {r"-:.*linear_attn\.in_proj_[ab]$": {},
                    r"+:.*shared_expert\.down_proj$": {"bits": 8, "group_size": -1}}},
        lambda m: None if BA.match(m) else (
            (8, -1, False, False) if m.endswith("shared_expert.down_proj") else (4, 32, False, False))),
    # llm-compressor W4A16 with zero points (packed along the outputs), experts only, group 128:
    # a rank's 128 expert features are one whole group
    "ct-w4a16-asym-g128-experts": ("ct", {
        "quant_method": "compressed-tensors", "format": "pack-quantized",
        "config_groups": {"group_0": {"targets": [r"re:.*mlp\.experts\.\d+\.(gate|up|down)_proj$"],
                                      "weights": {"num_bits": 4, "type": "int", "symmetric": False,
                                                  "strategy": "group", "group_size": 128}}}},
        lambda m: (4, 128, False, False) if EXPERT.match(m) else None),
}


@pytest.fixture(scope="module", params=list(CASES))
def int4_moe(request, tmp_path_factory):
    from g906.engine.loader import load_model

    fmt, qc, rules = CASES[request.param]
    hf = build_tiny_qwen35moe(seed=32)
    d = tmp_path_factory.mktemp(request.param)
    write_quantized(hf, d, fmt, qc, scheme_for=rules)
    ref = load_model(str(d), dtype="float32", device="cpu", progress=False)
    tp = _tp(str(d))
    yield hf, ref, tp
    tp.model.close()


def test_tp2_matches_tp1_and_transformers(int4_moe):
    hf, ref, tp = int4_moe
    assert tp.info["quantized_tensors"] == ref.info["quantized_tensors"] > 0
    assert tp.info["weight_bytes"] < ref.info["weight_bytes"]
    assert isinstance(ref.model.model.layers[0].mlp.experts.gate_up, GroupQuantExperts)
    assert tp.model.config.moe_intermediate_size == 128
    assert_tp_matches_tp1_and_hf(ref, tp, hf)
