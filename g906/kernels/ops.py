"""Public ops of g906.kernels: one function per hot-path operation.

Each dispatches through the registry (g906.kernels.registry) to its Triton kernel or its
PyTorch reference: CPU always gets the reference; on a GPU the Triton kernel runs when the
call is in its range; G906_KERNELS=reference|triton|auto forces a choice.
See docs/kernels.md for shapes and conventions.
"""

from __future__ import annotations

import os

import torch

from . import registry
from .activation import reference as _act
from .argmax import reference as _argmax
from .attention import reference as _attn
from .conv1d import reference as _conv
from .embedding import reference as _emb
from .gdn import reference as _gdn
from .int4 import reference as _gq
from .int4.weight import is_group_quant
from .kv_cache import reference as _kv
from .linear import reference as _lin
from .moe import reference as _moe
from .norm import reference as _norm
from .rotary import reference as _rot

FUSED_QTYPES = ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")


def _ok(*tensors) -> bool:
    return all(t is None or registry.dtype_ok(t) for t in tensors)


def _last_contig(*tensors) -> bool:
    return all(t is None or t.stride(-1) == 1 for t in tensors)


def _norm_fits_step(gated_norm, num_v_heads) -> bool:
    """The decode step kernel's gated norm: z [B, Hv, Dv] rows, Dv a power of two up to 1024
    (its programs per head, of 16 or 32 columns, then divide the arrival counter's 64)."""
    z = gated_norm[0]
    dv = z.shape[-1]
    return (z.dim() == 3 and z.shape[1] == num_v_heads and z.stride(-1) == 1 and _ok(z)
            and dv & (dv - 1) == 0 and dv <= 1024)


def _linear_supports(x, weight, **_):
    if x.dim() != 2 or not _ok(x) or x.stride(1) != 1:
        return False
    if isinstance(weight, torch.Tensor):
        return (weight.dtype == x.dtype and weight.stride(1) == 1
                and x.dtype in (torch.float16, torch.float32))
    if is_group_quant(weight):
        return x.dtype in (torch.float16, torch.float32)   # group_quant_matmul picks its own path
    return (getattr(weight, "qtype", None) in FUSED_QTYPES and weight.shape[1] % 256 == 0
            and x.dtype in (torch.float16, torch.float32))


registry.register("rms_norm", _norm.rms_norm, "norm.kernel:rms_norm",
                  lambda x, w, eps, **kw: _ok(x, kw.get("residual")))
registry.register("gated_rms_norm", _norm.gated_rms_norm, "norm.kernel:gated_rms_norm",
                  lambda x, z, w, eps: _ok(x, z))
registry.register("rotary_", _rot.rotary_, "rotary.kernel:rotary_",
                  lambda q, k, *a: _ok(q, k) and _last_contig(q, k))
registry.register("qk_norm_rotary", _rot.qk_norm_rotary, "rotary.kernel:qk_norm_rotary",
                  lambda q, k, *a, kv_store=None, **kw: (
                      _ok(q, k) and _last_contig(q, k) and q.shape[-1] <= 512
                      and (kv_store is None or (_ok(*kv_store[:3])
                                                and _last_contig(*kv_store[:3])))))
registry.register("silu_and_mul", _act.silu_and_mul, "activation.kernel:silu_and_mul",
                  lambda x: _ok(x))
registry.register("store_kv", _kv.store_kv, "kv_cache.kernel:store_kv",
                  lambda k, v, kc, vc, s: _ok(k, v, kc) and _last_contig(k, v, kc, vc))
registry.register("paged_decode_attention", _attn.paged_decode_attention,
                  "attention.kernel:paged_decode_attention",
                  lambda q, kc, *a, **kw: _ok(q, kc) and q.shape[-1] <= 256
                  and _last_contig(q, kc, kw.get("gate")))
registry.register("prefill_attention", _attn.prefill_attention,
                  "attention.kernel:prefill_attention",
                  lambda q, kc, *a, **kw: _ok(q, kc) and q.shape[-1] <= 256
                  and _last_contig(q, kc, kw.get("gate")))
registry.register("causal_conv1d_prefill", _conv.causal_conv1d_prefill,
                  "conv1d.kernel:causal_conv1d_prefill",
                  lambda x, w, cu, st, *a: _ok(x, st) and x.stride(1) == 1 and w.stride(1) == 1)
registry.register("causal_conv1d_decode", _conv.causal_conv1d_decode,
                  "conv1d.kernel:causal_conv1d_decode",
                  lambda x, w, st, *a: _ok(x, st) and x.stride(1) == 1 and w.stride(1) == 1)
registry.register("conv_gated_delta_rule_decode", _gdn.conv_gated_delta_rule_decode,
                  "gdn.kernel:conv_gated_delta_rule_decode",
                  lambda qkv, w, st, lens, a, b, A_log, dtb, ssm, *r, gated_norm=None, **kw: (
                      _ok(qkv, st) and ssm.dtype == torch.float32 and w.stride(1) == 1
                      and _last_contig(qkv, a, b)
                      and (gated_norm is None or _norm_fits_step(gated_norm, a.shape[1]))))
registry.register("gated_delta_rule_decode", _gdn.gated_delta_rule_decode,
                  "gdn.kernel:gated_delta_rule_decode",
                  lambda q, k, v, a, b, *r, **kw: _ok(q, k, v) and r[2].dtype == torch.float32
                  and _last_contig(q, k, v, a, b))
registry.register("gated_delta_rule_prefill", _gdn.gated_delta_rule_prefill,
                  "gdn.kernel:gated_delta_rule_prefill",
                  lambda q, k, v, a, b, *r, **kw: _ok(q, k, v) and r[3].dtype == torch.float32
                  and _last_contig(q, k, v, a, b) and k.shape[-1] <= 256)
registry.register("gated_delta_rule_recurrent", _gdn.gated_delta_rule_recurrent,
                  "gdn.recurrent:gated_delta_rule_recurrent",
                  lambda q, k, v, a, b, *r, **kw: _ok(q, k, v) and r[3].dtype == torch.float32
                  and _last_contig(q, k, v, a, b) and k.shape[-1] <= 256)
registry.register("argmax", _argmax.argmax, "argmax.kernel:argmax",
                  lambda x: x.dim() == 2 and x.stride(1) == 1 and _ok(x))
registry.register("embedding", _emb.embedding, "embedding.kernel:embedding",
                  lambda w, ids, dtype: (getattr(w, "qtype", None) in FUSED_QTYPES
                                         and w.shape[1] % 256 == 0 and w.data.stride(1) == 1
                                         and ids.dim() == 1 and ids.is_contiguous()
                                         and dtype in (torch.float16, torch.float32)))
registry.register("group_quant_matmul", _gq.group_quant_matmul, "int4.kernel:group_quant_matmul",
                  lambda x, w: _ok(x) and _gq_supported(x, w))
registry.register("linear", _lin.linear, "linear.kernel:linear", _linear_supports)
registry.register("linear_pair", _lin.linear_pair, "linear.kernel:linear_pair",
                  lambda x, w0, w1, **_: _linear_supports(x, w0) and _linear_supports(x, w1))
registry.register("linear_glu", _lin.linear_glu, "linear.kernel:linear_glu",
                  lambda x, w, **_: _linear_supports(x, w) and w.shape[0] % 2 == 0)
# fused into the decode GEMV where its recompute is cheap (linear.kernel: FUSED_RECOMPUTE_MAX);
# otherwise the Triton side runs the two ops through the registry, each in its own range
registry.register("silu_mul_linear", _lin.silu_mul_linear, "linear.kernel:silu_mul_linear",
                  lambda x, w, **_: x.dim() == 2 and _ok(x))
registry.register("gated_norm_linear", _lin.gated_norm_linear, "linear.kernel:gated_norm_linear",
                  lambda o, z, nw, eps, w, **_: o.dim() == 3 and _ok(o, z))


def _gq_supported(x, w) -> bool:
    from .int4.kernel import supported

    return supported(x, w)


def group_quant_matmul(x, weight):
    """x [T, K] @ weight^T for a GroupQuantWeight (GPTQ / AWQ / compressed-tensors int4 or int8,
    g906/kernels/int4): the dequant-GEMV at decode sizes, the tiled GEMM above."""
    return registry.dispatch("group_quant_matmul", x, weight)

def _moe_supports(x, w_gate_up, w_down, topk_ids, topk_weights):
    from .moe.kernel import supports

    return _ok(x) and supports(x, w_gate_up, w_down, topk_ids, topk_weights)


registry.register("moe_experts", _moe.moe_experts, "moe.kernel:moe_experts", _moe_supports)


def moe_route(router_logits, top_k, renormalize):
    """(weights fp32 [T, k], expert ids int32 [T, k]) of router_logits [T, E]: softmax over the
    experts, top k, renormalised to sum 1 when asked."""
    return _moe.route(router_logits, top_k, renormalize)


def moe_experts(x, w_gate_up, w_down, topk_ids, topk_weights):
    """The routed experts of a sparse MoE MLP: y [T, H] = sum_j topk_weights[t, j] *
    down_e(silu(gate_e(x_t)) * up_e(x_t)), e = topk_ids[t, j]. w_gate_up [E, 2I, H] ([gate; up]
    per expert) and w_down [E, H, I]: dense, GGUF blocks (QuantizedExperts) or any container
    with dequantize_experts(ids) (g906/kernels/moe/reference.py). Only the chosen experts'
    weights are read: a routed GEMV at decode, a grouped GEMM over expert-sorted pairs above."""
    return registry.dispatch("moe_experts", x, w_gate_up, w_down, topk_ids, topk_weights)


def rms_norm(x, weight, eps, *, residual=None, zero_centred=False):
    """RMSNorm over the last dim (fp32 math). With `residual`: returns (norm(x + residual),
    x + residual). zero_centred: weight applied as (1 + w)."""
    return registry.dispatch("rms_norm", x, weight, eps, residual=residual,
                             zero_centred=zero_centred)


def gated_rms_norm(x, z, weight, eps):
    """norm(x) * weight * silu(z), rows of the last dim."""
    return registry.dispatch("gated_rms_norm", x, z, weight, eps)


def silu_mul_linear(x, weight, *, add_norm=None):
    """linear(silu_and_mul(x), weight): the MLP's down projection of x [T, 2I] = [gate | up].
    add_norm: as linear's."""
    if add_norm is None:
        return registry.dispatch("silu_mul_linear", x, weight)
    return registry.dispatch("silu_mul_linear", x, weight, add_norm=add_norm)


def gated_norm_linear(o, z, norm_weight, eps, weight, *, add_norm=None):
    """linear(gated_rms_norm(o, z, norm_weight, eps) as [T, H * D], weight): the linear
    attention's output projection of its per-head normed, gated output o, z [T, H, D].
    add_norm: as linear's."""
    if add_norm is None:
        return registry.dispatch("gated_norm_linear", o, z, norm_weight, eps, weight)
    return registry.dispatch("gated_norm_linear", o, z, norm_weight, eps, weight, add_norm=add_norm)


def rotary_(q, k, positions, cos_sin_cache, rot_dim):
    """In-place NeoX rotary on the first rot_dim of head_dim of q [T,Hq,D] and k [T,Hk,D]."""
    return registry.dispatch("rotary_", q, k, positions, cos_sin_cache, rot_dim)


def qk_norm_rotary(q, k, q_weight, k_weight, eps, positions, cos_sin_cache, rot_dim, *,
                   zero_centred=False, kv_store=None):
    """rotary_ of the per-head RMSNorms of q [T,Hq,D] and k [T,Hk,D] (weights [D]; zero_centred:
    applied as 1 + w), as new contiguous tensors (q, k): one kernel instead of three.
    kv_store = (v, k_cache, v_cache, slot_mapping): the same kernel also does store_kv of the
    new k and v."""
    return registry.dispatch("qk_norm_rotary", q, k, q_weight, k_weight, eps, positions,
                             cos_sin_cache, rot_dim, zero_centred=zero_centred, kv_store=kv_store)


def argmax(x):
    """x [T, V] -> int64 [T]: each row's first maximum (greedy sampling's token)."""
    return registry.dispatch("argmax", x)


def silu_and_mul(x):
    """silu(x[:, :I]) * x[:, I:] for x [T, 2I]."""
    return registry.dispatch("silu_and_mul", x)


def store_kv(k, v, k_cache, v_cache, slot_mapping):
    """k_cache/v_cache [num_blocks, block_size, Hk, D][slot] = k/v [T, Hk, D]; slot -1 skips."""
    return registry.dispatch("store_kv", k, v, k_cache, v_cache, slot_mapping)


def paged_decode_attention(q, k_cache, v_cache, block_tables, seq_lens, scale, *, gate=None,
                           max_seq_len=None):
    """One query token per sequence: q [B,Hq,D] -> [B,Hq,D]; times sigmoid(gate) if given.
    max_seq_len (optional) bounds the context so fewer, fuller splits are used."""
    kw = {"gate": gate}
    if max_seq_len is not None and registry.choose("paged_decode_attention", q, k_cache) == "triton":
        kw["max_seq_len"] = max_seq_len
    return registry.dispatch("paged_decode_attention", q, k_cache, v_cache, block_tables,
                             seq_lens, scale, **kw)


def prefill_attention(q, k_cache, v_cache, block_tables, cu_seqlens_q, seq_lens, scale, *,
                      gate=None, max_seqlen_q=None):
    """Causal varlen attention of the new tokens q [T,Hq,D] over the paged cache."""
    return registry.dispatch("prefill_attention", q, k_cache, v_cache, block_tables,
                             cu_seqlens_q, seq_lens, scale, gate=gate, max_seqlen_q=max_seqlen_q)


def causal_conv1d_prefill(x, weight, cu_seqlens, conv_states, state_slots, has_initial_state,
                          context_lens):
    """silu(causal depthwise conv(x)) for a flat varlen batch whose sequence b starts at its
    token context_lens[b]; updates the rings conv_states[slot] ([C, K]: token t in column t % K)."""
    return registry.dispatch("causal_conv1d_prefill", x, weight, cu_seqlens, conv_states,
                             state_slots, has_initial_state, context_lens)


def causal_conv1d_decode(x, weight, conv_states, state_slots, seq_lens):
    """One step per sequence, its token seq_lens[b] - 1: x [B, C] -> [B, C]; rings updated."""
    return registry.dispatch("causal_conv1d_decode", x, weight, conv_states, state_slots, seq_lens)


def conv_gated_delta_rule_decode(qkv, conv_weight, conv_states, seq_lens, a, b, A_log, dt_bias,
                                 ssm_states, state_slots, *, num_k_heads, head_k_dim,
                                 v_head_order="grouped", gated_norm=None):
    """causal_conv1d_decode of the raw projection qkv [B, 2 Hk Dk + Hv Dv], then
    gated_delta_rule_decode of its q | k | v heads: one kernel on a GPU. gated_norm = (z [B, Hv,
    Dv], weight, eps): the output is gated_rms_norm(o, z, weight, eps), in the same kernel."""
    kw = {} if gated_norm is None else {"gated_norm": gated_norm}
    return registry.dispatch("conv_gated_delta_rule_decode", qkv, conv_weight, conv_states,
                             seq_lens, a, b, A_log, dt_bias, ssm_states, state_slots,
                             num_k_heads=num_k_heads, head_k_dim=head_k_dim,
                             v_head_order=v_head_order, **kw)


def gated_delta_rule_decode(q, k, v, a, b, A_log, dt_bias, ssm_states, state_slots, *,
                            v_head_order="grouped"):
    """One recurrent step per sequence; ssm_states fp32 [S,Hv,Dk,Dv] updated in place."""
    return registry.dispatch("gated_delta_rule_decode", q, k, v, a, b, A_log, dt_bias,
                             ssm_states, state_slots, v_head_order=v_head_order)


def gated_delta_rule_prefill(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                             has_initial_state, *, v_head_order="grouped", chunk_size=64):
    """Chunked gated delta rule over a flat varlen batch; final state -> ssm_states[slot]."""
    return registry.dispatch("gated_delta_rule_prefill", q, k, v, a, b, A_log, dt_bias,
                             cu_seqlens, ssm_states, state_slots, has_initial_state,
                             v_head_order=v_head_order, chunk_size=chunk_size)


def gated_delta_rule_recurrent(q, k, v, a, b, A_log, dt_bias, cu_seqlens, ssm_states, state_slots,
                               has_initial_state, *, v_head_order="grouped"):
    """gated_delta_rule_prefill's contract computed token by token: for sequences of a few
    tokens (a speculative verify step and its rollback), where whole chunks would be padding."""
    return registry.dispatch("gated_delta_rule_recurrent", q, k, v, a, b, A_log, dt_bias,
                             cu_seqlens, ssm_states, state_slots, has_initial_state,
                             v_head_order=v_head_order)


def embedding(weight, ids, dtype):
    """Rows ids (int [T]) of a GGUF-quantized embedding table (a QuantizedTensor [vocab, K]) as
    dense [T, K] of dtype: one kernel on a GPU."""
    return registry.dispatch("embedding", weight, ids, dtype)


def linear(x, weight, *, add_norm=None, rms_of=None):
    """x [T, in] @ weight^T: weight dense [out, in], a QuantizedTensor (GGUF blocks) or the
    PackedQuant that prepare_linear_weight made of one.

    The RMSNorm between two projections can ride on them (g906/kernels/linear/residual_norm.py):
    add_norm = (residual, norm_weight, zero_centred) returns (h, hn, ss): h = y + residual, hn =
    h * norm_weight, ss [T, P] partial sums of h * h; rms_of = (ss, eps) multiplies x (such an
    hn) by 1 / rms(h) per row first.
    Exact definitions: g906/kernels/linear/reference.py (add_norm_out, rms_in)."""
    if add_norm is None and rms_of is None:
        return registry.dispatch("linear", x, weight)
    return registry.dispatch("linear", x, weight, add_norm=add_norm, rms_of=rms_of)


def linear_pair(x, w0, w1, *, rms_of=None):
    """(linear(x, w0), linear(x, w1)) for two weights that do not stack into one (a GGUF mix's
    projections of one input in two types): on a GPU's decode path, one kernel launch for
    both when they are repacked GGUF weights of one K. rms_of: as linear's."""
    if rms_of is None:
        return registry.dispatch("linear_pair", x, w0, w1)
    return registry.dispatch("linear_pair", x, w0, w1, rms_of=rms_of)


def linear_glu(x, weight, *, rms_of=None):
    """silu(x @ gate^T) * (x @ up^T) [T, I] for weight = [gate; up] (2I rows, stacked): the
    SwiGLU of an MLP's fused gate/up projection, in the GEMV that computes it at decode.
    rms_of: as linear's."""
    if rms_of is None:
        return registry.dispatch("linear_glu", x, weight)
    return registry.dispatch("linear_glu", x, weight, rms_of=rms_of)


def linear_fuses_norm(x, weight) -> bool:
    """Whether linear(x, weight) (and its silu / gated-norm forms) computes add_norm and
    rms_of inside its GEMV: a Triton GEMV at decode sizes. Elsewhere they cost extra ops, and
    the separate RMSNorm is the better plan. G906_SPLIT_NORM=0: never (the A/B switch)."""
    if not 0 < x.shape[0] <= 16 or os.environ.get("G906_SPLIT_NORM", "1") == "0":
        return False
    if registry.choose("linear", x, weight) != "triton":
        return False
    from .linear.kernel import linear_fuses_norm as fuses

    return fuses(x, weight)


def prepare_linear_weight(weight):
    """Once, at load time: a QuantizedTensor on a GPU becomes a PackedQuant (aligned planes the
    dequant-GEMV reads with 16-byte loads; g906/kernels/linear/repack.py); anything else (CPU,
    dense, types or shapes without a packed layout, G906_KERNELS=reference) is returned as is."""
    from .linear import repack

    if registry.mode() == "reference":
        return weight
    return repack.prepare(weight)


def keep_dense_on_cpu(weight) -> bool:
    """Dequantize a GGUF weight on the CPU once and keep its float32 matrix with it, for the
    reference matmul to use on every call (g906/kernels/linear/reference.py). False when the
    weight is not a CPU GGUF weight or G906_CPU_DEQUANT_CACHE=0."""
    from .linear import reference

    data = getattr(weight, "data", None)
    if getattr(weight, "qtype", None) is None or not isinstance(data, torch.Tensor) or data.device.type != "cpu":
        return False
    if not reference.cpu_dequant_cache_enabled():
        return False
    reference.dense_weight(weight)
    return True
