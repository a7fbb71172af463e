"""Recipe resolution of GPTQ / AWQ / compressed-tensors directories: the scheme detected from
quantization_config, unsupported schemes refused naming them (for the embedded engine), and
tensor-parallel splits that would break a quantization group refused with the numbers."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from .test_resolve import errors_of, plan_of

TEXT = {"num_hidden_layers": 4, "hidden_size": 64, "intermediate_size": 256, "num_attention_heads": 4,
        "num_key_value_heads": 2, "head_dim": 32, "vocab_size": 256, "max_position_embeddings": 8192,
        "full_attention_interval": 4, "linear_num_key_heads": 2, "linear_num_value_heads": 4,
        "linear_key_head_dim": 16, "linear_value_head_dim": 32,
        "layer_types": ["linear_attention", "linear_attention", "linear_attention", "full_attention"]}

GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": False, "sym": True}
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 32, "zero_point": True, "version": "GEMM"}
CT = {"quant_method": "compressed-tensors", "format": "pack-quantized",
      "config_groups": {"group_0": {"targets": ["Linear"], "weights": {
          "num_bits": 4, "type": "int", "symmetric": True, "strategy": "group", "group_size": 32}}},
      "ignore": ["lm_head"]}


def write_dir(path: Path, qc: dict | None) -> Path:
    from safetensors.numpy import save_file

    path.mkdir(parents=True, exist_ok=True)
    cfg = {"architectures": ["Qwen3_5ForCausalLM"], **TEXT}
    if qc is not None:
        cfg["quantization_config"] = qc
    (path / "config.json").write_text(json.dumps(cfg))
    save_file({"model.layers.0.mlp.down_proj.qweight": np.zeros((32, 64), dtype=np.int32),
               "model.layers.0.mlp.down_proj.scales": np.zeros((2, 64), dtype=np.float16)},
              str(path / "model.safetensors"))
    (path / "tokenizer.json").write_text("{}")
    return path


@pytest.mark.parametrize("qc, method, detail", [
    (GPTQ, "gptq", "GPTQ (gptq): 4-bit, group 128, symmetric"),
    ({**GPTQ, "checkpoint_format": "gptq_v2", "sym": False, "desc_act": True}, "gptq",
     "4-bit, group 128, asymmetric, act-order"),
    (AWQ, "awq", "AWQ (gemm): 4-bit, group 32, asymmetric"),
    (CT, "compressed-tensors", "compressed-tensors (pack-quantized): 4-bit, group 32, symmetric"),
])
def test_detected_scheme(tmp_path, qc, method, detail):
    write_dir(tmp_path / "m", qc)
    plan = plan_of(tmp_path, '[model]\nsource = "m"\n')
    assert plan.quantization == method and detail in plan.quant_detail
    assert plan_of(tmp_path, f'[model]\nsource = "m"\nquantization = "{method}"\n').quantization == method
    assert plan.model_facts["weights_bytes_by_dtype"] == {"I32": 32 * 64 * 4, "F16": 2 * 64 * 2}


@pytest.mark.parametrize("qc, named", [
    ({"quant_method": "fp8", "activation_scheme": "dynamic"}, "FP8"),
    ({**GPTQ, "bits": 3}, "GPTQ 3-bit"),
    ({**GPTQ, "checkpoint_format": "marlin"}, "'marlin' checkpoint format"),
    ({**AWQ, "version": "gemv_fast"}, "GEMV_FAST packing"),
    ({**CT, "format": "nvfp4-pack-quantized"}, "'nvfp4-pack-quantized' format"),
    ({**CT, "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}},
      "format": "float-quantized"}, "'float-quantized' format"),
    ({**CT, "config_groups": {"g": {"targets": ["Linear"], "weights": {"num_bits": 8, "type": "float"}}}}, "FP8 weights"),
    ({"quant_method": "bitsandbytes", "load_in_4bit": True}, "bitsandbytes"),
])
def test_unsupported_scheme_is_refused_naming_it(tmp_path, qc, named):
    write_dir(tmp_path / "m", qc)
    errs = errors_of(tmp_path, '[model]\nsource = "m"\n')
    assert named in errs[0]["message"] and errs[0]["key"] == "model.source"
    assert "GPTQ 4/8-bit" in errs[0]["help"] and "AWQ 4-bit" in errs[0]["help"]
    # vLLM reads more schemes: the hand-off is not refused
    plan = plan_of(tmp_path, '[model]\nsource = "m"\n[engine]\nkind = "vllm"\n')
    assert plan.quantization == qc["quant_method"]


def test_contradicting_quantization_value(tmp_path):
    write_dir(tmp_path / "m", AWQ)
    errs = errors_of(tmp_path, '[model]\nsource = "m"\nquantization = "gptq"\n')
    assert "config.json says 'awq'" in errs[0]["message"] and errs[0]["line"] == 3


def test_tp_split_that_breaks_groups_is_refused_with_numbers(tmp_path):
    write_dir(tmp_path / "m", GPTQ)             # group 128; down_proj K = 256, out_proj K = 128
    errs = errors_of(tmp_path, '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n')
    msg = errs[0]["message"]
    assert errs[0]["key"] == "parallel.tensor_parallel_size"
    assert "linear_attn.out_proj: each of 2 ranks would take 128 / 2 = 64 input features" in msg
    assert "self_attn.o_proj" in msg and "down_proj" not in msg   # 256 / 2 = 128 is whole
    assert errs[0]["help"].endswith("allows: 1")
    write_dir(tmp_path / "m", {**GPTQ, "group_size": 32})
    assert plan_of(tmp_path, '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n').tensor_parallel_size == 2
    write_dir(tmp_path / "m", {**GPTQ, "group_size": -1})         # per-channel: any split
    assert plan_of(tmp_path, '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n').tensor_parallel_size == 2
    # left in 16 bit by the rules: not split as packed
    write_dir(tmp_path / "m", {**GPTQ, "modules_to_not_convert": ["linear_attn", "o_proj"]})
    assert plan_of(tmp_path, '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n').tensor_parallel_size == 2


def test_act_order_cannot_be_split(tmp_path):
    write_dir(tmp_path / "m", {**GPTQ, "group_size": 32, "desc_act": True})
    errs = errors_of(tmp_path, '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n')
    assert "act-order scatters each group of 32" in errs[0]["message"]
    write_dir(tmp_path / "m", {**GPTQ, "group_size": 32, "desc_act": True, "static_groups": True})
    assert plan_of(tmp_path, '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n').tensor_parallel_size == 2


def test_autogptq_quantize_config_json(tmp_path):
    d = write_dir(tmp_path / "m", None)
    (d / "quantize_config.json").write_text(json.dumps({"bits": 4, "group_size": 128, "desc_act": False}))
    plan = plan_of(tmp_path, '[model]\nsource = "m"\n')
    assert plan.quantization == "gptq" and "4-bit, group 128" in plan.quant_detail
    (d / "quantize_config.json").write_text(json.dumps({"bits": 3, "group_size": 128}))
    assert "GPTQ 3-bit" in errors_of(tmp_path, '[model]\nsource = "m"\n')[0]["message"]


MOE_TEXT = {**{k: v for k, v in TEXT.items() if k != "intermediate_size"}, "num_experts": 8,
            "num_experts_per_tok": 2, "moe_intermediate_size": 128, "shared_expert_intermediate_size": 256}


def write_moe_dir(path: Path, qc: dict) -> Path:
    d = write_dir(path, qc)
    cfg = json.loads((d / "config.json").read_text())
    cfg = {**{k: v for k, v in cfg.items() if k != "intermediate_size"}, **MOE_TEXT,
           "architectures": ["Qwen3_5MoeForCausalLM"]}
    (d / "config.json").write_text(json.dumps(cfg))
    from safetensors.numpy import save_file

    save_file({"model.layers.0.mlp.experts.0.down_proj.qweight": np.zeros((16, 64), dtype=np.int32),
               "model.layers.0.mlp.experts.0.down_proj.scales": np.zeros((1, 64), dtype=np.float16),
               "model.layers.0.mlp.gate.weight": np.zeros((8, 64), dtype=np.float16)},
              str(d / "model.safetensors"))
    return d


def test_moe_expert_splits_checked_per_expert(tmp_path):
    """An MoE checkpoint: each routed expert's down_proj (128 input features) and the shared
    expert's (256) are split over the ranks; the rules apply per expert module."""
    experts_only = {r"-:.*shared_expert.*": {}, r"-:.*\.(self_attn|linear_attn)\..*": {}}
    toml = '[model]\nsource = "m"\n[parallel]\ntensor_parallel_size = 2\n'
    write_moe_dir(tmp_path / "m", {**GPTQ, "group_size": 128, "dynamic": experts_only})
    msg = errors_of(tmp_path, toml)[0]["message"]
    assert "model.layers.0.mlp.experts.0.down_proj: each of 2 ranks would take 128 / 2 = 64 input features" in msg
    assert "shared_expert" not in msg and "o_proj" not in msg
    write_moe_dir(tmp_path / "m", {**GPTQ, "group_size": 32, "desc_act": True, "dynamic": experts_only})
    msg = errors_of(tmp_path, toml)[0]["message"]
    assert "mlp.experts.0.down_proj" in msg and "act-order scatters each group of 32" in msg
    write_moe_dir(tmp_path / "m", {**GPTQ, "group_size": 64, "dynamic": experts_only})
    plan = plan_of(tmp_path, toml)
    assert plan.tensor_parallel_size == 2
    # the doctor's active-bytes estimate takes the packed experts as stored
    assert plan.model_facts["expert_bytes"] == 16 * 64 * 4 + 64 * 2
