"""GPTQ, AWQ and compressed-tensors checkpoints of a tiny random Qwen3.5 (packed by
tests/engine/hf_quant_writer.py from the formats' specifications): g906 loads them packed and
computes what transformers computes on the dequantized weights (float32, CPU): logits and
greedy continuations. Per-module rules (dynamic, modules_to_not_convert, ignore, a second
config group) leave the linear-attention b/a projections or lm_head in 16 bit, or switch a
module to 8 bits."""

from __future__ import annotations

import json
import re

import pytest
import torch

from g906.errors import G906Error
from g906.kernels.int4.weight import GroupQuantWeight

from .conftest import TinyRunner, build_tiny_qwen35, hf_greedy, hf_logits, random_prompt, rel_err
from .hf_quant_writer import write_quantized

pytestmark = pytest.mark.usefixtures("torch_one_thread")

BA = re.compile(r".*linear_attn\.in_proj_[ab]$")


def _gptq_rules(m):  # dynamic: b/a stay 16-bit, down_proj 8-bit
    if BA.match(m):
        return None
    return (8, 32, True, False) if m.endswith("down_proj") else (4, 32, True, False)


CASES = {
    "gptq-v1-sym-dynamic": (
        "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": True, "desc_act": False,
                 "checkpoint_format": "gptq",
                 "dynamic": {r"-:.*linear_attn\.in_proj_[ab]$": {}, r"+:.*down_proj$": {"bits": 8}}},
        _gptq_rules),
    "gptq-v1-asym-act-order": (
        "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32, "sym": False, "desc_act": True,
                 "modules_to_not_convert": ["in_proj_a", "in_proj_b"]},
        lambda m: None if BA.match(m) else (4, 32, False, True)),
    "gptq-v2-asym-per-channel": (
        "gptq_v2", {"quant_method": "gptq", "bits": 4, "group_size": -1, "sym": False, "desc_act": False,
                    "checkpoint_format": "gptq_v2", "modules_to_not_convert": ["in_proj_a", "in_proj_b"]},
        lambda m: None if BA.match(m) else (4, -1, False, False)),
    "awq-gemm": (
        "awq", {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "gemm",
                "modules_to_not_convert": ["in_proj_a", "in_proj_b"]},
        lambda m: None if BA.match(m) else (4, 32, False, False)),
    "ct-w4a16-act-order+w8a16-channel": (
        "ct", {"quant_method": "compressed-tensors", "format": "pack-quantized",
               "quantization_status": "compressed",
               "config_groups": {
                   "group_0": {"targets": ["Linear"], "input_activations": None, "output_activations": None,
                               "weights": {"num_bits": 4, "type": "int", "symmetric": True, "strategy": "group",
                                           "group_size": 32, "actorder": "group", "dynamic": False}},
                   "group_1": {"targets": [r"re:.*mlp\.down_proj$"],
                               "weights": {"num_bits": 8, "type": "int", "symmetric": False,
                                           "strategy": "channel", "dynamic": False}}},
               "ignore": ["lm_head", r"re:.*linear_attn\.in_proj_[ab]$"]},
        lambda m: None if BA.match(m) else ((8, -1, False, False) if m.endswith("down_proj") else (4, 32, True, True))),
}


@pytest.fixture(scope="module", params=list(CASES))
def quantized(request, tmp_path_factory):
    fmt, qc, rules = CASES[request.param]
    hf = build_tiny_qwen35(seed=7)
    d = tmp_path_factory.mktemp(request.param)
    done = write_quantized(hf, d, fmt, qc, scheme_for=rules)
    from g906.engine.loader import load_model

    lm = load_model(str(d), dtype="float32", device="cpu", progress=False)
    return request.param, hf, lm, done


def test_weights_stay_packed_as_the_config_says(quantized):
    name, _, lm, done = quantized
    model = lm.model
    n_packed = 0
    for mod_name, mod in model.named_modules():
        w = getattr(mod, "weight", None)
        if isinstance(w, GroupQuantWeight):
            n_packed += 1
            assert w.qweight.dtype == torch.int32
            assert w.nbytes < w.shape[0] * w.shape[1] * 2        # smaller than fp16
    assert lm.info["quantized_tensors"] == len(done)
    from g906.bench.synthetic import weight_stats      # the bench's accounting counts them packed

    assert weight_stats(model)["weight_bytes"] == lm.info["weight_bytes"]
    lin = model.model.layers[0].linear_attn
    assert not isinstance(lin.in_proj_b.weight, GroupQuantWeight)    # left in 16 bit by the rules
    down = model.model.layers[0].mlp.down_proj.weight
    assert isinstance(down, GroupQuantWeight)
    if name.startswith("gptq-v1-sym"):
        assert down.bits == 8 and down.zeros is None
    if "act-order" in name:
        assert model.model.layers[1].self_attn.o_proj.weight.perm is not None


def test_logits_and_greedy_match_transformers(quantized):
    _, hf, lm, _ = quantized
    prompt = random_prompt(24, 5)
    want = hf_greedy(hf, prompt, 10)
    runner = TinyRunner(lm.model, max_seqs=1)
    logits = runner.step([0], [prompt])
    assert rel_err(logits[0], hf_logits(hf, prompt)[-1]) < 1e-4
    runner.release(0)
    runner.cache.reset_slots([0])
    assert runner.greedy(0, prompt, 10) == want


def test_unsupported_schemes_are_refused_naming_them(tmp_path):
    from g906.engine.loader import load_model

    hf = build_tiny_qwen35(seed=1)
    hf.save_pretrained(tmp_path)
    cfg = json.loads((tmp_path / "config.json").read_text())
    for qc, named in [({"quant_method": "fp8", "weight_block_size": [128, 128]}, "FP8"),
                      ({"quant_method": "gptq", "bits": 3, "group_size": 128}, "GPTQ 3-bit"),
                      ({"quant_method": "awq", "bits": 4, "version": "gemv"}, "GEMV"),
                      ({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
                        "config_groups": {"group_0": {"targets": ["Linear"], "weights": {"num_bits": 4, "type": "float"}}}},
                       "nvfp4-pack-quantized"),
                      ({"quant_method": "compressed-tensors", "format": "pack-quantized",
                        "config_groups": {"g": {"targets": ["Linear"], "input_activations": {"num_bits": 8},
                                                "weights": {"num_bits": 8, "type": "int", "strategy": "channel"}}}},
                       "quantized activations")]:
        cfg["quantization_config"] = qc
        (tmp_path / "config.json").write_text(json.dumps(cfg))
        with pytest.raises(G906Error) as e:
            load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)
        assert named in e.value.message and "GPTQ" in e.value.hint and "AWQ" in e.value.hint


def test_packed_module_the_config_calls_16_bit_is_an_error(tmp_path):
    from g906.engine.loader import load_model

    hf = build_tiny_qwen35(seed=2)
    write_quantized(hf, tmp_path, "gptq", {"quant_method": "gptq", "bits": 4, "group_size": 32},
                    scheme_for=lambda m: None if BA.match(m) else (4, 32, True, False))
    cfg = json.loads((tmp_path / "config.json").read_text())
    cfg["quantization_config"]["modules_to_not_convert"] = ["in_proj_a", "in_proj_b", "mlp.up_proj"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(G906Error, match=r"mlp\.up_proj is stored quantized"):
        load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)


def test_autogptq_quantize_config_json(tmp_path):
    """An older AutoGPTQ directory: no quantization_config in config.json, a quantize_config.json
    beside it."""
    from g906.engine.loader import load_model

    hf = build_tiny_qwen35(seed=3)
    qc = {"bits": 4, "group_size": 32, "sym": True, "desc_act": False}
    write_quantized(hf, tmp_path, "gptq", {"quant_method": "gptq", **qc},
                    scheme_for=lambda m: None if BA.match(m) else (4, 32, True, False))
    cfg = json.loads((tmp_path / "config.json").read_text())
    del cfg["quantization_config"]
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    (tmp_path / "quantize_config.json").write_text(json.dumps({**qc, "modules_to_not_convert": ["in_proj_a", "in_proj_b"]}))
    lm = load_model(str(tmp_path), dtype="float32", device="cpu", progress=False)
    assert isinstance(lm.model.model.layers[0].mlp.down_proj.weight, GroupQuantWeight)
    prompt = random_prompt(12, 2)
    assert TinyRunner(lm.model, max_seqs=1).greedy(0, prompt, 6) == hf_greedy(hf, prompt, 6)
