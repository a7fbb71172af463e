"""estimate_memory: the arithmetic on known shapes, TP, dtypes, budgets."""

from __future__ import annotations

from g906.doctor.memory import GPU_RUNTIME_OVERHEAD, estimate_memory, fmt_bytes, resolve_dtype

from tests.doctor.plans import GB, QWEN35_9B, make_plan

GiB = 1024 ** 3


def test_resolve_dtype():
    assert resolve_dtype("auto", "rocm", "gfx906") == "float16"
    assert resolve_dtype("auto", "cuda") == "bfloat16"
    assert resolve_dtype("auto", "cpu") == "float32"
    assert resolve_dtype("bfloat16", "rocm") == "bfloat16"


def test_kv_and_linear_state_arithmetic(tmp_path):
    plan = make_plan(tmp_path, facts=QWEN35_9B, weights=5 * GB, max_model_len=8192, max_num_seqs=4)
    est = estimate_memory(plan, device_kind="rocm", capacities=[32 * GiB])
    d = est.per_device[0]
    assert est.dtype == "float16" and est.max_model_len == 8192 and est.max_num_seqs == 4
    # 32 layers, 1 in 4 full attention -> 8 full layers; K and V; 4 KV heads x 256; fp16
    assert d.kv_cache == 8 * 2 * 4 * 256 * 2 * 8192 * 4
    # 24 linear layers: recurrent 32 v-heads x 128 x 128 fp32 + conv rings (2*16*128 + 32*128) x 4
    # fp16, x 4 seqs
    assert d.linear_state == 24 * (32 * 128 * 128 * 4 + (2 * 16 * 128 + 32 * 128) * 4 * 2) * 4
    assert d.weights == 5 * GB
    assert d.overhead == GPU_RUNTIME_OVERHEAD
    # prefix caching (on by default): at least two state snapshots per sequence, here more
    # than a 10% share of the cache budget would give
    assert d.prefix_snapshots == 2 * d.linear_state
    assert d.total == d.weights + d.kv_cache + d.linear_state + d.prefix_snapshots + d.activations + d.overhead
    assert d.budget == int(32 * GiB * 0.9) and d.fits is True and est.fits is True


def test_prefix_cache_snapshot_pool_is_counted(tmp_path):
    plan = make_plan(tmp_path, facts=QWEN35_9B, weights=5 * GB, max_model_len=262144, max_num_seqs=1)
    d = estimate_memory(plan, device_kind="rocm", capacities=[32 * GiB]).per_device[0]
    per_state = d.linear_state
    # a long context: the 10% share of the budget (a ninth of the KV cache) is the larger
    assert d.prefix_snapshots == int(0.1 / 0.9 * d.kv_cache) // per_state * per_state > 2 * per_state
    plan.recipe.engine.embedded.prefix_snapshot_share = 0.25
    assert estimate_memory(plan, device_kind="rocm").per_device[0].prefix_snapshots > d.prefix_snapshots
    plan.recipe.engine.prefix_caching = False
    off = estimate_memory(plan, device_kind="rocm", capacities=[32 * GiB]).per_device[0]
    assert off.prefix_snapshots == 0 and off.total == d.total - d.prefix_snapshots


def test_tensor_parallel_splits_weights_and_kv(tmp_path):
    p1 = make_plan(tmp_path, facts=QWEN35_9B, weights=8 * GB, tp=1)
    p2 = make_plan(tmp_path, facts=QWEN35_9B, weights=8 * GB, tp=2)
    e1 = estimate_memory(p1, device_kind="rocm").per_device
    e2 = estimate_memory(p2, device_kind="rocm").per_device
    assert len(e1) == 1 and len(e2) == 2
    assert e2[0].weights == e1[0].weights // 2
    assert e2[0].kv_cache == e1[0].kv_cache // 2
    assert e2[0].linear_state < e1[0].linear_state


def test_cpu_uses_float32_and_no_gpu_overhead(tmp_path):
    plan = make_plan(tmp_path, facts=QWEN35_9B, weights=1 * GB, tp=4)
    est = estimate_memory(plan, device_kind="cpu", capacities=[16 * GiB])
    assert est.dtype == "float32" and est.tensor_parallel_size == 1
    assert [d.device for d in est.per_device] == ["cpu"]
    assert est.per_device[0].overhead == 0 and est.per_device[0].budget == 16 * GiB


def test_hf_bf16_weights_converted_to_fp32_on_cpu(tmp_path):
    facts = dict(QWEN35_9B, torch_dtype="bfloat16", weights_bytes=4 * GB)
    plan = make_plan(tmp_path, fmt="hf", quantization="none", facts=facts, weights=4 * GB)
    assert estimate_memory(plan, device_kind="cpu").per_device[0].weights == 8 * GB
    assert estimate_memory(plan, device_kind="rocm").per_device[0].weights == 4 * GB


def test_hf_gptq_counts_packed_bytes(tmp_path):
    """A 9B GPTQ-Int4: its int32 words stay packed (counted as stored), its fp16/bf16 tensors
    (scales, embeddings, norms, 16-bit projections) at the compute dtype; split over TP ranks."""
    by_dtype = {"I32": 4 * GB, "F16": GB // 4, "BF16": 2 * GB}
    facts = dict(QWEN35_9B, torch_dtype="bfloat16", weights_bytes=int(6.25 * GB), weights_bytes_by_dtype=by_dtype)
    plan = make_plan(tmp_path, fmt="hf", quantization="gptq", facts=facts, weights=int(6.25 * GB))
    rocm = estimate_memory(plan, device_kind="rocm")
    assert rocm.per_device[0].weights == 4 * GB + GB // 4 + 2 * GB
    assert any("stay packed" in n for n in rocm.assumptions)
    assert estimate_memory(plan, device_kind="cpu").per_device[0].weights == 4 * GB + GB // 2 + 4 * GB
    tp2 = make_plan(tmp_path, fmt="hf", quantization="gptq", facts=facts, weights=int(6.25 * GB), tp=2)
    assert estimate_memory(tp2, device_kind="rocm").per_device[0].weights == (6 * GB + GB // 4) // 2


def test_does_not_fit_and_unknown_capacity(tmp_path):
    plan = make_plan(tmp_path, facts=QWEN35_9B, weights=15 * GB, max_model_len=131072, max_num_seqs=16)
    est = estimate_memory(plan, device_kind="rocm", capacities=[16 * GiB])
    assert est.fits is False and est.per_device[0].fits is False
    unknown = estimate_memory(plan, device_kind="rocm")
    assert unknown.fits is None and unknown.per_device[0].budget is None


def test_missing_shapes_and_context_are_assumptions(tmp_path):
    plan = make_plan(tmp_path, facts={}, weights=1 * GB, max_model_len=None)
    est = estimate_memory(plan, device_kind="rocm")
    assert est.per_device[0].kv_cache == 0
    assert any("max_model_len not set" in a for a in est.assumptions)
    assert any("layer counts unknown" in a for a in est.assumptions)
    assert est.to_json()["per_device"][0]["weights"] == 1 * GB


def test_fmt_bytes():
    assert fmt_bytes(None) == "?"
    assert fmt_bytes(3 * GiB) == "3.0 GiB"
    assert fmt_bytes(5 * 1024 ** 2) == "5 MiB"


# Qwen3.5-35B-A3B (config.json of Qwen/Qwen3.5-35B-A3B, text_config) as a GGUF header gives it
QWEN35_35B_A3B = {
    "num_hidden_layers": 40, "hidden_size": 2048, "num_attention_heads": 16, "num_key_value_heads": 2,
    "head_dim": 256, "vocab_size": 248320, "full_attention_interval": 4, "linear_num_key_heads": 16,
    "linear_num_value_heads": 32, "linear_key_head_dim": 128, "linear_value_head_dim": 128,
    "linear_conv_kernel_dim": 4, "context_length": 262144, "num_experts": 256, "num_experts_per_tok": 8,
    "moe_intermediate_size": 512, "shared_expert_intermediate_size": 512,
    "expert_bytes": 18 * GiB, "expert_types": {"Q4_K": 80, "Q5_K": 20, "Q6_K": 20},
}


def test_moe_counts_active_weights_and_fits_one_mi50(tmp_path):
    plan = make_plan(tmp_path, facts=QWEN35_35B_A3B, weights=21 * GiB, architecture="qwen35moe",
                     max_model_len=32768, max_num_seqs=4)
    est = estimate_memory(plan, device_kind="rocm", capacities=[32 * GiB])
    d = est.per_device[0]
    assert d.weights == 21 * GiB
    # the non-expert 3 GiB plus 8 of 256 experts
    assert d.active_weights == 3 * GiB + 18 * GiB * 8 // 256
    assert est.fits is True
    note = next(n for n in est.assumptions if n.startswith("MoE:"))
    assert "256 experts, 8 per token" in note and "Q4_K x80" in note
    # two cards: each holds and reads half
    two = estimate_memory(make_plan(tmp_path, facts=QWEN35_35B_A3B, weights=21 * GiB, architecture="qwen35moe",
                                    tp=2), device_kind="rocm").per_device
    assert two[0].active_weights == -(-d.active_weights // 2) and two[0].weights == -(-d.weights // 2)


def test_moe_expert_bytes_from_hf_shapes(tmp_path):
    facts = {k: v for k, v in QWEN35_35B_A3B.items() if k not in ("expert_bytes", "expert_types")}
    plan = make_plan(tmp_path, facts=facts, weights=67 * GiB, fmt="hf", quantization="none",
                     architecture="Qwen3_5MoeForConditionalGeneration")
    d = estimate_memory(plan, device_kind="rocm").per_device[0]
    experts = 3 * 256 * 512 * 2048 * 40 * 2
    assert d.active_weights == d.weights - experts + experts * 8 // 256


def test_dense_models_read_all_their_weights(tmp_path):
    d = estimate_memory(make_plan(tmp_path, facts=QWEN35_9B, weights=5 * GB), device_kind="rocm").per_device[0]
    assert d.active_weights == d.weights
