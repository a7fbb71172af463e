"""The ops the model layers compute with.

By default g906.kernels.ops: each op dispatches to its Triton kernel on a GPU (when the call is
in the kernel's range) or to its PyTorch reference (always on CPU; G906_KERNELS=reference forces
it). g906.engine.layers.reference holds an independent PyTorch implementation of the same
signatures; to run the model on it, import the op names from there instead (one line)."""

from g906.kernels.ops import (  # noqa: F401
    causal_conv1d_decode,
    causal_conv1d_prefill,
    conv_gated_delta_rule_decode,
    embedding,
    gated_delta_rule_decode,
    gated_delta_rule_prefill,
    gated_delta_rule_recurrent,
    gated_norm_linear,
    gated_rms_norm,
    linear,
    linear_fuses_norm,
    linear_glu,
    linear_pair,
    moe_experts,
    moe_route,
    paged_decode_attention,
    prefill_attention,
    qk_norm_rotary,
    rms_norm,
    rotary_,
    silu_and_mul,
    silu_mul_linear,
    store_kv,
)

from g906.engine.layers.reference import dequantize_weight, make_cos_sin_cache  # noqa: F401
