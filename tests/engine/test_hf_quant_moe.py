"""Int4 MoE checkpoints (GPTQ, AWQ, compressed-tensors) of a tiny random Qwen3.5 MoE, packed by
tests/engine/hf_quant_writer.py one module per expert as the quantizers write them: g906 stacks
each projection's experts into one packed GroupQuantExperts (never dequantized at load) and
computes what transformers computes on the dequantized weights (float32, CPU). The configs
follow the releases: the router (mlp.gate) and shared_expert_gate stay 16-bit; dynamic /
modules_to_not_convert / ignore rules leave the shared expert or attention in 16 bit."""

from __future__ import annotations

import re

import pytest
import torch

from g906.engine.loader import load_model
from g906.errors import G906Error
from g906.kernels.int4.experts import GroupQuantExperts
from g906.kernels.int4.weight import GroupQuantWeight

from .conftest import assert_matches_transformers, build_tiny_qwen35moe
from .hf_quant_writer import write_quantized

pytestmark = pytest.mark.usefixtures("torch_one_thread")

EXPERT = re.compile(r".*\.mlp\.experts\.\d+\.(gate|up|down)_proj$")
BA = re.compile(r".*linear_attn\.in_proj_[ab]$")

CASES = {
    # Qwen-style GPTQ release: only the routed experts quantized (act order, per-expert g_idx)
    "gptq-v2-experts-only-act-order": (
        "gptq_v2", {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": True,
                    "checkpoint_format": "gptq_v2",
                    "dynamic": {r"-:.*shared_expert.*": {}, r"-:.*\.(self_attn|linear_attn)\..*": {}}},
        lambda m: (4, 32, True, True) if EXPERT.match(m) else None),
    "awq-gemm-asym": (
        "awq", {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": ["in_proj_a", "in_proj_b", "shared_expert_gate", "mlp.gate"]},
        lambda m: None if BA.match(m) else (4, 32, False, False)),
    "ct-w4a16-g128-asym+w8-down": (
        "ct", {"quant_method": "compressed-tensors", "format": "pack-quantized",
               "config_groups": {
                   "group_0": {"targets": ["Linear"],
                               "weights": {"num_bits": 4, "type": "int", "symmetric": False, "strategy": "group",
                                           "group_size": 128, "dynamic": False}},
                   "group_1": {"targets": [r"re:.*mlp\.experts\.\d+\.down_proj$"],
                               "weights": {"num_bits": 8, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 64, "dynamic": False}}},
               "ignore": ["lm_head", r"re:.*mlp\.gate$", r"re:.*shared_expert_gate$", r"re:.*in_proj_[ab]$"]},
        lambda m: None if BA.match(m) else ((8, 64, True, False) if EXPERT.match(m) and m.endswith("down_proj")
                                            else (4, 128, False, False))),
}


@pytest.fixture(scope="module", params=list(CASES))
def quantized(request, tmp_path_factory):
    fmt, qc, rules = CASES[request.param]
    hf = build_tiny_qwen35moe(seed=21)
    d = tmp_path_factory.mktemp(request.param)
    done = write_quantized(hf, d, fmt, qc, scheme_for=rules)
    lm = load_model(str(d), dtype="float32", device="cpu", progress=False)
    return request.param, hf, lm, done, d


def test_experts_stay_packed_one_tensor_per_projection(quantized):
    name, _, lm, done, _ = quantized
    mlp = lm.model.model.layers[0].mlp
    gu, dn = mlp.experts.gate_up, mlp.experts.down_proj
    assert isinstance(gu, GroupQuantExperts) and isinstance(dn, GroupQuantExperts)
    E, inter, H = 16, 256, 256
    assert gu.shape == (E, 2 * inter, H) and dn.shape == (E, H, inter)
    assert gu.qweight.dtype == torch.int32 and gu.qweight.shape == (E, 2 * inter, H // 8)
    assert gu.nbytes < E * 2 * inter * H                                   # under 1 byte a weight
    assert not isinstance(mlp.gate.weight, (GroupQuantWeight, GroupQuantExperts))   # the router: 16-bit
    shared = mlp.shared_expert.down_proj.weight
    assert isinstance(shared, GroupQuantWeight) == (not name.startswith("gptq"))
    if name.startswith("gptq"):
        assert gu.perm is not None and dn.perm is not None and gu.perm.shape[0] == E
    if name.startswith("ct"):
        assert dn.bits == 8 and dn.group_size == 64 and gu.bits == 4 and gu.zeros is not None
    # a routed expert counts once per projection (stacked), a dense module once
    experts = {m for m in done if EXPERT.match(m)}
    stacked = {re.sub(r"\.experts\.\d+\.", ".experts.", m) for m in experts}
    assert lm.info["quantized_tensors"] == len(done) - len(experts) + len(stacked)
    from g906.bench.synthetic import weight_stats

    stats = weight_stats(lm.model)
    assert stats["weight_bytes"] == lm.info["weight_bytes"]
    assert 0 < stats["expert_bytes"] < stats["weight_bytes"]


def test_logits_and_greedy_match_transformers(quantized):
    _, hf, lm, _, _ = quantized
    assert_matches_transformers(lm.model, hf, greedy_tokens=8)


def test_experts_quantized_differently_are_refused(tmp_path):
    """A dynamic rule that gives one expert other bits: the experts cannot share one tensor."""
    hf = build_tiny_qwen35moe(seed=22)
    odd = re.compile(r".*\.layers\.1\.mlp\.experts\.3\.up_proj$")
    write_quantized(hf, tmp_path, "gptq", {
        "quant_method": "gptq", "bits": 4, "group_size": 32,
        "dynamic": {r"+:.*\.layers\.1\.mlp\.experts\.3\.up_proj$": {"bits": 8},
                    r"-:.*shared_expert.*": {}, r"-:.*\.(self_attn|linear_attn)\..*": {}}},
        scheme_for=lambda m: (((8, 32, True, False) if odd.match(m) else (4, 32, True, False))
                              if EXPERT.match(m) else None))
    with pytest.raises(G906Error) as e:
        load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)
    assert "layers.1.mlp.experts.up_proj" in e.value.message and "expert 3 is int8" in e.value.message


def test_a_missing_expert_part_is_named(quantized, tmp_path):
    """An expert whose scales are missing from the files: the loader names the module."""
    from safetensors.torch import load_file, save_file

    _, _, _, _, d = quantized
    sd = load_file(str(d / "model.safetensors"))
    part = "scales" if "model.layers.0.mlp.experts.5.gate_proj.scales" in sd else "weight_scale"
    del sd[f"model.layers.0.mlp.experts.5.gate_proj.{part}"]
    save_file(sd, str(tmp_path / "model.safetensors"), metadata={"format": "pt"})
    (tmp_path / "config.json").write_text((d / "config.json").read_text())
    with pytest.raises(G906Error, match=r"experts\.5\.gate_proj lacks " + part):
        load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)
