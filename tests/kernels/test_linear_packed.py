"""Repacked GGUF weights (g906/kernels/linear/repack.py) and the kernels that read them: the packed
planes decode bit-for-bit like gguf.quants.dequantize, the Triton GEMV/GEMM over them equals
the reference (dequantize + matmul) on odd shapes, masked tails, split K and strided inputs,
and the engine's Linear repacks only on a GPU."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from g906.engine.weights import QuantizedTensor
from g906.kernels import registry
from g906.kernels.linear import repack

from .conftest import DEVICE
from .test_linear import random_blocks
from .util import assert_close, gpu, linear_launchers_with, needs_gpu, randn

QTYPES = ["Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K"]
# resident bytes of the packed planes over the GGUF bytes (exact; limit 1.15)
OVERHEAD = {"Q8_0": 1.0, "Q4_0": 1.0, "Q4_K": 148 / 144, "Q5_K": 180 / 176, "Q6_K": 1.0}


def qweight(rows, cols, qtype, seed):
    return QuantizedTensor(random_blocks(rows, cols, qtype, seed).to(DEVICE), qtype, (rows, cols))


def packed_case(N, K, qtype, wseed, T, xseed):
    """(weight, its packed planes, fp16 activations [T, K]) of a random GEMV case."""
    w = qweight(N, K, qtype, wseed)
    x = randn(T, K, dtype=torch.float16, gen=torch.Generator().manual_seed(xseed))
    return w, repack.pack(w.data, qtype, w.shape), x


def packed_call(x, p, **cfg):
    from g906.kernels.linear.packed import packed_matmul

    return packed_matmul(x, p, **cfg)


@pytest.mark.parametrize("qtype", QTYPES)
def test_pack_decodes_like_gguf(qtype):
    from gguf import GGMLQuantizationType
    from gguf.quants import dequantize

    raw = random_blocks(3, 768, qtype, 5)
    ref = dequantize(raw.numpy(), GGMLQuantizationType[qtype]).reshape(3, 768)
    p = repack.pack(raw, qtype, (3, 768))
    np.testing.assert_array_equal(repack.dequantize_packed(p).numpy(), ref)
    assert p.nbytes == pytest.approx(OVERHEAD[qtype] * raw.numel())
    assert p.nbytes <= 1.15 * raw.numel()
    assert all(t.is_contiguous() and t.shape[0] == 3 for t in p.planes.values())


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T", [1, 3, 20])
def test_packed_linear(qtype, T):
    # K = 768: fewer words than one iteration covers, so the masked tail path runs
    g = torch.Generator().manual_seed(50)
    N, K = 19, 768
    w = qweight(N, K, qtype, 6)
    p = repack.pack(w.data, qtype, w.shape)
    dtype = torch.float16 if T == 3 else torch.float32
    x = randn(T, K, dtype=dtype, gen=g)
    ref = registry.call_reference("linear", x, w)
    assert_close(registry.call_triton("linear", x, p), ref)
    assert_close(registry.call_reference("linear", x, p), ref)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T,cfg", [(1, dict(H=8, BLOCK_N=4)),                # unmasked loop
                                   (1, dict(H=8, BLOCK_N=4, PAIRS=False)),   # 4-bit fields singly
                                   (3, dict(H=8, BLOCK_N=4, PREFETCH=True)), # next words early
                                   (1, dict(H=8, BLOCK_N=4, PAIRS=2)),      # folded scales
                                   (1, dict(H=8, BLOCK_N=4, WSPLIT=True)),  # words split
                                   (3, dict(H=8, BLOCK_N=4, WSPLIT=False)),
                                   (3, dict(H=8, BLOCK_N=4, WSPLIT=True, PREFETCH=True)),
                                   (2, dict(H=4, BLOCK_N=2, PAIRS=2, SPLIT=3)),
                                   (1, dict(H=8, BLOCK_N=4, ONE_IMM=True)),  # 1.0f immediate (ROCm)
                                   (3, dict(H=8, BLOCK_N=8, PAIRS=2, WSPLIT=True, ONE_IMM=True)),
                                   (1, dict(H=8, BLOCK_N=4, CVT=True, WSPLIT=True)),  # bytes converted
                                   (5, dict(H=4, BLOCK_N=2, BLOCK_T=2)),    # token blocks, a partial one
                                   (7, dict(H=8, BLOCK_N=4, BLOCK_T=4, SPLIT=2, WSPLIT=True, CVT=True)),
                                   (3, dict(H=8, BLOCK_N=4, CVT=True, WSPLIT=False, ONE_IMM=True)),
                                   (2, dict(H=8, SPLIT=2, BLOCK_N=2)),       # split K, even
                                   (5, dict(H=4, SPLIT=3, BLOCK_N=4)),       # split K, tails
                                   (1, dict(H=8, BLOCK_N=4, PRELOAD=True)),  # first step peeled
                                   (3, dict(H=8, BLOCK_N=4, PRELOAD=True, SPLIT=3, PAIRS=2)),
                                   (1, dict(H=64, BLOCK_N=4, PRELOAD=True))])  # one masked step
def test_packed_gemv_configs(qtype, T, cfg):
    g = torch.Generator().manual_seed(51)
    N, K = 7, 1024
    w = qweight(N, K, qtype, 7)
    p = repack.pack(w.data, qtype, w.shape)
    x = randn(T, K, gen=g)
    assert_close(packed_call(x, p, **cfg), registry.call_reference("linear", x, w))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("cfg", [dict(DOT=True), dict(DOT=True, SPLIT=3, BLOCK_N=8)])
def test_packed_dot_path_few_rows(qtype, cfg):
    # the tensor-core path CUDA takes for T = 2..16 in fp16 (BLOCK_M = 16), split K with tails
    w, p, x = packed_case(11, 768, qtype, 16, 5, 54)
    assert_close(packed_call(x, p, **cfg), registry.call_reference("linear", x, w))


def test_packed_strided_rows_and_fp16():
    g = torch.Generator().manual_seed(52)
    N, K = 9, 512
    w = qweight(N, K, "Q4_K", 8)
    p = repack.pack(w.data, "Q4_K", w.shape)
    xx = randn(4, K + 64, dtype=torch.float16, gen=g)
    x = xx[:, 64:]
    assert_close(registry.call_triton("linear", x, p), registry.call_reference("linear", x, w))


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("rows", [7, 8])
def test_pack_in_row_chunks(qtype, rows, monkeypatch):
    raw = random_blocks(rows, 512, qtype, 17)
    whole = repack.pack(raw, qtype, (rows, 512))
    # chunks of 2 rows (whole row pairs: 3 * 512 elements rounds down)
    monkeypatch.setattr(repack, "CHUNK_ELEMENTS", 3 * 512)
    parts = repack.pack(raw, qtype, (rows, 512))
    assert parts.row_pairs == whole.row_pairs == (qtype == "Q4_K" and rows == 8)
    for k in whole.planes:
        assert torch.equal(parts.planes[k], whole.planes[k])


@pytest.mark.parametrize("qtype", ["Q4_K", "Q6_K"])
@pytest.mark.parametrize("rows", [(5, 3), (4, 4)])
def test_rows_stack_and_select(qtype, rows):
    a = random_blocks(rows[0], 512, qtype, 9)
    b = random_blocks(rows[1], 512, qtype, 10)
    both = repack.cat_rows([repack.pack(a, qtype, (rows[0], 512)),
                            repack.pack(b, qtype, (rows[1], 512))])
    # Q4_K parts of whole row pairs stack as row pairs, others as rows
    paired = qtype == "Q4_K" and rows[0] % 2 == 0
    assert both.row_pairs == paired
    ref = repack.pack(torch.cat([a, b]), qtype, (8, 512), row_pairs=paired)
    assert both.shape == (8, 512)
    for k in ref.planes:
        assert torch.equal(both.planes[k], ref.planes[k])
    idx = torch.tensor([6, 0, 3, 3])                 # even and odd rows, one twice
    sel = both.select_rows(idx)
    assert not sel.row_pairs
    assert torch.equal(sel.dequantize(), ref.dequantize()[idx])


def test_row_pairs_layout():
    """Q4_K row pairs: qs regrouped pair by pair (row 2i the low halves of both rows' words,
    row 2i + 1 the high halves), the other planes as they were; the swap undoes itself."""
    raw = random_blocks(6, 512, "Q4_K", 21)
    rows = repack.pack(raw, "Q4_K", (6, 512), row_pairs=False)
    pairs = repack.pack(raw, "Q4_K", (6, 512))
    assert pairs.row_pairs and not rows.row_pairs
    a, b = (rows.planes["qs"][i::2].to(torch.int64) & 0xFFFFFFFF for i in (0, 1))
    lo, hi = (pairs.planes["qs"][i::2].to(torch.int64) & 0xFFFFFFFF for i in (0, 1))
    assert torch.equal(lo & 0xFFFF, a & 0xFFFF) and torch.equal(lo >> 16, b & 0xFFFF)
    assert torch.equal(hi & 0xFFFF, a >> 16) and torch.equal(hi >> 16, b >> 16)
    for k in ("dm", "scm"):
        assert torch.equal(pairs.planes[k], rows.planes[k])
    assert torch.equal(repack.unpair_rows(pairs).planes["qs"], rows.planes["qs"])
    assert torch.equal(pairs.dequantize(), rows.dequantize())
    with pytest.raises(AssertionError):
        repack.pack(random_blocks(5, 512, "Q4_K", 22), "Q4_K", (5, 512), row_pairs=True)


@pytest.mark.parametrize("N,T,cfg,glu,same", [
    (16, 1, {}, False, True),                                    # packed fp16 (PAIRS 3)
    (16, 1, dict(H=8, BLOCK_N=8, PAIRS=2), False, True),         # fp32 fields, folded scales
    (16, 1, dict(H=8, BLOCK_N=4, PAIRS=0, PRELOAD=True), False, True),  # a field at a time
    (16, 1, dict(H=4, BLOCK_N=8, PREFETCH=True), False, True),   # packed fp16, next words early
    (16, 3, dict(H=8, BLOCK_N=4), False, True),                  # a few tokens
    (16, 20, {}, False, True),                                   # the tiled (prefill) path
    (16, 1, {}, True, True), (16, 1, dict(H=8, BLOCK_N=2), True, True),  # SwiGLU: gate, up pairs
    (12, 1, dict(H=8, BLOCK_N=8, PAIRS=2), True, True),          # partial row blocks
    # one row a program asked: two (a whole pair) over row pairs
    (14, 1, dict(H=8, BLOCK_N=1), False, False),
    # odd gate rows: pairs would straddle gate and up, so the silu-mul runs after the GEMV
    (10, 1, {}, True, False),
])
def test_row_pairs_run_like_rows(N, T, cfg, glu, same):
    """Every path over row-paired Q4_K gives what it gives over the rows as they are (the same
    bits where it runs the same blocks; within the fp16 / fp32 bounds where not)."""
    w, pairs, x = packed_case(N, 768, "Q4_K", 31, T, 32)
    rows = repack.pack(w.data, "Q4_K", w.shape, row_pairs=False)
    assert pairs.row_pairs
    for xx in (x, x.float()):
        got = packed_call(xx, pairs, glu=glu, **cfg)
        want = packed_call(xx, rows, glu=glu, **cfg)
        assert not torch.isnan(got).any()
        if same:
            assert torch.equal(got, want)
        else:
            assert_close(got, want)


def test_prepare_keeps_cpu_and_unpackable_weights():
    w = QuantizedTensor(random_blocks(4, 512, "Q4_K", 11), "Q4_K", (4, 512))
    assert repack.prepare(w) is w                                   # CPU: stays GGUF blocks
    odd = QuantizedTensor(random_blocks(4, 96, "Q8_0", 12), "Q8_0", (4, 96))
    assert not repack.can_pack(odd)                                 # K % 256 != 0
    dense = torch.zeros(3, 3)
    assert repack.prepare(dense) is dense


def test_engine_linear_hook_on_cpu():
    from g906.engine.layers.linear import Linear, fuse_weights

    lin = Linear(512, 4)
    w = QuantizedTensor(random_blocks(4, 512, "Q6_K", 13), "Q6_K", (4, 512))
    lin.set_weight("weight", w)
    assert lin.weight is w                                          # resident bytes == file bytes
    # packed weights (as on a GPU) stack like GGUF blocks
    l1, l2 = Linear(512, 4), Linear(512, 2)
    p1 = repack.pack(w.data, "Q6_K", w.shape)
    raw2 = random_blocks(2, 512, "Q6_K", 14)
    p2 = repack.pack(raw2, "Q6_K", (2, 512))
    l1.set_weight("weight", p1)
    l2.set_weight("weight", p2)
    assert l1.weight is p1 and "weight" not in dict(l1.named_parameters())
    fused = fuse_weights([l1, l2])
    ref = repack.pack(torch.cat([w.data, raw2]), "Q6_K", (6, 512))
    assert torch.equal(fused.dequantize(), ref.dequantize())



@pytest.mark.parametrize("pack", [False, True])
@pytest.mark.parametrize("kinds,stacks", [
    ([("Q5_K", 6), ("Q4_K", 5), ("Q4_K", 2), ("Q6_K", 3), ("Q4_K", 1)], [[1, 2, 4]]),
    ([("Q5_K", 6), ("Q4_K", 5), ("Q4_K", 2), ("Q4_K", 1)], [[1, 2, 3]]),     # two: linear_pair
])
def test_fused_projections_stack_per_kind(pack, kinds, stacks):
    """A GGUF mix's projections of one input (Q5_K qkv, Q4_K z / b / a) run as one matmul per
    kind, in the members' order; each output equals its own Linear's before fusing."""
    from g906.engine.layers.linear import FusedProjections, Linear

    lins = []
    for i, (qt, rows) in enumerate(kinds):
        lin = Linear(512, rows)
        w = qweight(rows, 512, qt, 30 + i)
        lin.set_weight("weight", repack.pack(w.data, qt, w.shape) if pack else w)
        lins.append(lin)
    x = randn(3, 512, dtype=torch.float32, gen=torch.Generator().manual_seed(7))
    want = [lin(x) for lin in lins]
    fp = FusedProjections(lins)
    fp.fuse()
    assert [idx for idx, _ in fp.stacks] == stacks               # the Q5_K and Q6_K stay alone
    assert [lin.weight is None for lin in lins] == [i in stacks[0] for i in range(len(kinds))]
    got = fp(x)
    assert [tuple(y.shape) for y in got] == [(3, r) for _, r in kinds]
    for g, w in zip(got, want):
        assert_close(g, w)


def test_packed_layers_hand_the_norm_to_the_next_gemvs(monkeypatch):
    """The decode wiring on repacked K-quant weights (as on a GPU): an output projection given
    the next RMSNorm returns a NormedInput (no norm kernel), which a two-kind FusedProjections
    (one pair launch) and the MLP (the gate/up GEMV with its SwiGLU, then the down projection,
    itself handing on the next norm) consume; the same as projection, RMSNorm, projections."""
    from g906.engine.layers.linear import FusedProjections, Linear
    from g906.engine.layers.mlp import MLP
    from g906.engine.layers.norms import AddNorm, NormedInput, RMSNorm

    monkeypatch.setenv("G906_KERNELS", "triton")        # the GPU's choices, on the CPU too
    H, I = 256, 256
    g = torch.Generator().manual_seed(70)

    def linear(k, n, qt, seed):
        lin = Linear(k, n)
        w = qweight(n, k, qt, seed)
        lin.set_weight("weight", repack.pack(w.data, qt, w.shape))
        return lin

    def rmsnorm():
        norm = RMSNorm(H, 1e-6)
        norm.weight = randn(H, gen=g, scale=0.3)
        return norm

    o_proj, norm, norm2 = linear(H, H, "Q4_K", 71), rmsnorm(), rmsnorm()
    mlp = MLP(H, I)
    mlp.gate_proj, mlp.up_proj = linear(H, I, "Q4_K", 72), linear(H, I, "Q4_K", 73)
    mlp.down_proj = linear(I, H, "Q6_K", 74)
    mlp.post_load()
    qkv = FusedProjections([linear(H, 12, "Q5_K", 75), linear(H, 6, "Q4_K", 76)])
    qkv.fuse()
    x, residual = randn(1, H, gen=g), randn(1, H, gen=g)

    y = o_proj(x, AddNorm(residual, norm))
    assert isinstance(y, NormedInput)
    out = mlp(y, AddNorm(y.h, norm2))
    assert isinstance(out, NormedInput)
    heads = qkv(out)
    # the same with every norm and the silu-mul as separate ops (reference kernels)
    normed, h = registry.call_reference("rms_norm", o_proj(x), norm.weight, 1e-6, residual=residual,
                                        zero_centred=True)
    assert_close(y.h, h)
    act = registry.call_reference("silu_and_mul", normed @ mlp.gate_up_weight.dequantize().t())
    normed2, h2 = registry.call_reference("rms_norm", act @ mlp.down_proj.weight.dequantize().t(),
                                          norm2.weight, 1e-6, residual=h, zero_centred=True)
    assert_close(out.h, h2)
    for got, (_, w) in zip(heads, qkv.stacks + [([1], qkv.linears[0].weight)]):
        assert_close(got, normed2 @ w.dequantize().t())


def test_linear_attention_decode_takes_its_gated_norm_from_the_step(monkeypatch):
    """A linear-attention layer whose out_proj is repacked (as on a GPU): in decode the step
    kernel applies the gated RMSNorm (no norm kernel, no norm in the GEMV), and the output is
    the reference's conv + recurrent step, gated_rms_norm, then the dequantized projection."""
    from g906.engine.context import ForwardContext
    from g906.engine.layers import ops as layer_ops
    from g906.engine.layers.gated_deltanet import GatedDeltaNet
    from g906.engine.layers.linear import Linear

    monkeypatch.setenv("G906_KERNELS", "triton")
    monkeypatch.setattr(layer_ops, "gated_norm_linear", None)    # the path the layer must not take
    H, Hk, Hv, Dk, Dv, K = 256, 2, 8, 32, 32, 4
    g = torch.Generator().manual_seed(80)
    gdn = GatedDeltaNet(H, Hk, Hv, Dk, Dv, K, 1e-6, head_order="tiled")
    w_in = []
    for lin in (gdn.in_proj_qkv, gdn.in_proj_z, gdn.in_proj_b, gdn.in_proj_a):
        w_in.append(randn(lin.out_features, H, gen=g, scale=H ** -0.5))
        lin.set_weight("weight", w_in[-1])
    w_out = qweight(H, Hv * Dv, "Q4_K", 81)
    out_proj = Linear(Hv * Dv, H)
    out_proj.set_weight("weight", repack.pack(w_out.data, "Q4_K", w_out.shape))
    gdn.out_proj = out_proj
    gdn.conv1d.set_weight("weight", randn(gdn.conv_dim, K, gen=g, scale=0.5))
    gdn.norm.set_weight("weight", randn(Dv, gen=g, scale=0.3) + 1.0)
    gdn.A_log, gdn.dt_bias = randn(Hv, gen=g, scale=0.5), randn(Hv, gen=g, scale=0.5)
    gdn.post_load()
    B, S = 2, 3
    conv0 = randn(S, gdn.conv_dim, K, gen=g)
    ssm0 = randn(S, Hv, Dk, Dv, gen=g, scale=0.3)
    gdn.conv_state, gdn.ssm_state = conv0.clone(), ssm0.clone()
    i32 = dict(dtype=torch.int32, device=DEVICE)
    lens, slots = torch.tensor([5, 9], **i32), torch.tensor([2, 0], **i32)
    ctx = ForwardContext(False, torch.tensor([0, 1, 2], **i32), lens, lens - 1,
                         torch.zeros(B, dtype=torch.int64, device=DEVICE),
                         torch.zeros(B, 1, **i32), slots, torch.ones(B, dtype=torch.bool, device=DEVICE),
                         1, 9)
    x = randn(B, H, gen=g)
    got = gdn(x, ctx)

    qkv, z, b, a = (x @ w.t() for w in w_in)
    o = registry.call_reference("conv_gated_delta_rule_decode", qkv, gdn.conv1d.weight, conv0, lens,
                                a, b, gdn.A_log, gdn.dt_bias, ssm0, slots, num_k_heads=Hk,
                                head_k_dim=Dk, v_head_order="tiled")
    normed = registry.call_reference("gated_rms_norm", o, z.view(B, Hv, Dv), gdn.norm.weight, 1e-6)
    assert_close(got, registry.call_reference("linear", normed.reshape(B, -1), w_out))
    assert_close(gdn.ssm_state, ssm0, tol=1e-5)


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("cfg", [dict(H=8, BLOCK_N=4), dict(H=8, BLOCK_N=8, PRELOAD=True),
                                 dict(H=4, BLOCK_N=4, SPLIT=2)])
def test_packed_gemv_whole_row_blocks(qtype, cfg):
    """Rows that fill every program (EVEN_N: each row's planes addressed from the program's
    first row by a compile-time offset, no clamp): the plain GEMV, the SwiGLU epilogue (gate
    and up rows I apart) and the two-weight launch equal their references; the odd row
    counts of the other tests take the clamped path."""
    from g906.kernels.linear.packed import packed_matmul

    w, p, x = packed_case(16, 1024, qtype, 91, 1, 90)
    K = w.shape[1]
    assert_close(packed_call(x, p, **cfg), registry.call_reference("linear", x, w))
    if cfg.get("SPLIT", 1) == 1:
        ref = registry.call_reference("linear_glu", x, w)
        assert_close(packed_matmul(x, p, glu=True, **cfg), ref)
    other = qweight(8, K, "Q4_K", 92)
    got = registry.call_triton("linear_pair", x, p, repack.pack(other.data, "Q4_K", other.shape))
    for o, ww in zip(got, (w, other)):
        assert_close(o, registry.call_reference("linear", x, ww))


@pytest.mark.parametrize("types", [("Q5_K", "Q4_K"), ("Q4_K", "Q6_K"), ("Q8_0", "Q4_0")])
@pytest.mark.parametrize("K,T", [(512, 1), (2048, 1), (512, 3)])
def test_linear_pair_one_launch(types, K, T):
    """Two packed weights of different types over one input, one launch: each output equals
    its own GEMV's reference (row tails, masked and even K, a few tokens)."""
    from g906.kernels.linear import packed_config as C

    ws = [qweight(n, K, qt, 40 + i) for i, (qt, n) in enumerate(zip(types, (13, 6)))]
    pws = [repack.pack(w.data, w.qtype, w.shape) for w in ws]
    x = randn(T, K, dtype=torch.float16, gen=torch.Generator().manual_seed(8))
    cs = C._pq_pair_configs(x, pws)
    paired = cs is not None
    assert paired == (DEVICE == "cpu" or T == 1)        # CUDA fp16 from 2 tokens: tensor cores
    if types == ("Q5_K", "Q4_K") and T == 1 and K == 512:
        # 13 Q5_K rows: 4 a program, fp32 fields; an 8192-row qkv (8 a program) runs its
        # segment in packed fp16, the Q4_K one its fp32 fields
        assert [c["PAIRS"] for c in cs] == [1, 2]
        qkv = repack.pack(random_blocks(8192, K, "Q5_K", 45), "Q5_K", (8192, K))
        assert [c["PAIRS"] for c in C._pq_pair_configs(x, [qkv, pws[1]])] == [3, 2]
    got = registry.call_triton("linear_pair", x, *pws)
    if paired:                                            # views of one [T, 13 + 6] output
        assert got[0].data_ptr() + 13 * got[0].element_size() == got[1].data_ptr()
    for g, w in zip(got, ws):
        assert_close(g, registry.call_reference("linear", x, w))
    other = repack.pack(qweight(4, 256, "Q4_K", 50).data, "Q4_K", (4, 256))
    assert C._pq_pair_configs(x, [pws[0], other]) is None     # another K: one launch each


@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T,cfg", [(1, {}), (1, dict(H=8, BLOCK_N=4)), (1, dict(H=8, BLOCK_N=8, PAIRS=2)),
                                   (3, dict(H=8, BLOCK_N=2, BLOCK_T=2)),   # token blocks, row tails
                                   (1, dict(H=8, BLOCK_N=4, PRELOAD=True)),
                                   (2, dict(H=8, BLOCK_N=4, SPLIT=2)),     # split K: silu after
                                   (3, dict(DOT=True)), (20, {})])          # tensor cores, prefill
def test_linear_glu(qtype, T, cfg):
    """silu(x gate^T) * (x up^T) of a stacked [gate; up] weight, the GEMV's epilogue pairing
    gate row r with up row r + I: equal to the reference's product then silu-mul, odd I (row
    tails), and on the paths that run the two ops (split K, tensor cores, prefill)."""
    from g906.kernels.linear.packed import packed_matmul

    I, K = 13, 768
    w = qweight(2 * I, K, qtype, 60)
    p = repack.pack(w.data, qtype, w.shape)
    dtype = torch.float16 if T in (3, 20) else torch.float32
    x = randn(T, K, dtype=dtype, gen=torch.Generator().manual_seed(61))
    ref = registry.call_reference("linear_glu", x, w)
    assert ref.shape == (T, I)
    got = packed_matmul(x, p, glu=True, **cfg) if cfg else registry.call_triton("linear_glu", x, p)
    assert_close(got, ref)
    if not cfg:   # the engine's reference agrees with the kernels' one
        from g906.engine.layers import reference as engine_ref

        assert_close(engine_ref.linear_glu(x, w), ref)


@pytest.mark.parametrize("qtype", ["Q4_K", "Q5_K", "Q6_K"])
@pytest.mark.parametrize("K", [768, 1024])                   # a masked tail; whole iterations
@pytest.mark.parametrize("T,cfg", [(1, {}), (1, dict(H=8, BLOCK_N=2)),
                                   (1, dict(H=8, BLOCK_N=8, PRELOAD=True)),
                                   (1, dict(H=4, BLOCK_N=4, SPLIT=3)),
                                   (3, dict(H=8, BLOCK_N=4, BLOCK_T=2))])   # token blocks
def test_packed_k_quant_fp16_pairs(qtype, K, T, cfg):
    """Q4_K / Q5_K / Q6_K with fp16 activations in packed fp16, rows in pairs (PAIRS = 3,
    their default for one token at 8 rows or more): within fp16's bound of the reference with
    19 rows (a lone last row), and with the SwiGLU epilogue and the silu-mul on load; fp32
    activations and odd row blocks run the fp32 fields (Q4_K PAIRS = 2, the others 1), and
    so does Q6_K under the SwiGLU."""
    from g906.kernels.linear import packed_config as C
    from g906.kernels.linear.packed import packed_matmul

    g = torch.Generator().manual_seed(70)
    N = 19
    w = qweight(N, K, qtype, 71)
    p = repack.pack(w.data, qtype, w.shape)
    x = randn(T, K, dtype=torch.float16, gen=g)
    if not cfg and qtype != "Q6_K":
        fp32_fields = 2 if qtype == "Q4_K" else 1
        # the default: packed fp16 off ROCm at 8 rows or more (Q4_K always; Q5_K from 8192 rows)
        for rows, packed in ((N, qtype == "Q4_K"), (8192, True)):
            c = C._pq_gemv_config(1, rows, K, qtype, x.device)
            want = 3 if packed and not C.is_rocm() else fp32_fields
            assert C._pq_pairs(x, qtype, c, False) == want, rows
            assert C._pq_pairs(x.float(), qtype, c, False) == c["PAIRS"] == fp32_fields
            assert C._pq_pairs(x, qtype, dict(c, BLOCK_N=4), False) == fp32_fields
            # these programs load their first iteration before the PDL wait; Q5_K's 4-row
            # fp32 fields do not (pq_preloads)
            assert c["PRELOAD"] == packed, rows
        assert C._pq_pairs(x, qtype, dict(c, PAIRS=3, BLOCK_N=1), True) == fp32_fields
    assert_close(packed_matmul(x, p, PAIRS=3, **cfg), registry.call_reference("linear", x, w))
    xx = randn(T, 2 * K, dtype=torch.float16, gen=g)              # [gate | up] of the down projection
    ref = registry.call_reference("linear", registry.call_reference("silu_and_mul", xx), w)
    assert_close(packed_matmul(xx, p, silu=True, PAIRS=3, **cfg), ref)
    if "SPLIT" not in cfg and cfg.get("BLOCK_N", 8) % 4 == 0:     # gate/up pairs of rows
        wg = qweight(2 * 9, K, qtype, 72)
        pg = repack.pack(wg.data, qtype, wg.shape)
        assert_close(packed_matmul(x, pg, glu=True, PAIRS=3, **cfg),
                     registry.call_reference("linear_glu", x, wg))
        if qtype == "Q6_K":
            # the LM head's and the down projections' defaults: 8 rows in packed fp16, but
            # not under the SwiGLU (it would magnify the fp16 sums' rounding) nor with fp32
            # activations, where the fields stay fp32 on 4 rows; other shapes 4 rows
            for rows, k in ((248320, K), (4096, 12288), (12288, K), (8192, K)):
                c = C._pq_gemv_config(1, rows, k, qtype, x.device)
                packed = rows != 8192 and not C.is_rocm()
                assert (c["BLOCK_N"] == 8) == packed
                assert C._pq_pairs(x, qtype, c, False) == (3 if packed else 1)
                for xt, glu in ((x, True), (x.float(), False)):
                    cf = dict(c, PAIRS=C._pq_pairs(xt, qtype, c, False, glu))
                    assert cf["PAIRS"] == 1 and C._pq_rows(qtype, cf, False) == 4
                assert C._pq_rows(qtype, dict(c, PAIRS=1), True) == c["BLOCK_N"]


@gpu
@needs_gpu
@pytest.mark.parametrize("qtype", QTYPES)
@pytest.mark.parametrize("T", [1, 8, 300])
def test_packed_linear_real_shapes(qtype, T):
    g = torch.Generator().manual_seed(53)
    for N, K in ((4096, 12288), (12288, 4096)):
        w = qweight(N, K, qtype, 15)
        p = repack.prepare(w)
        assert isinstance(p, repack.PackedQuant)
        x = randn(T, K, dtype=torch.float16, gen=g)
        assert_close(registry.call_triton("linear", x, p), registry.call_reference("linear", x, w))


@pytest.mark.parametrize("qtype", QTYPES)
def test_packed_to_dense_and_the_prefill_path(qtype, monkeypatch):
    """Prefill on a GPU dequantizes packed weights to fp16 a row block at a time and runs the
    vendor GEMM: the dense rows equal the packed planes' exact decode (to rounding), for
    all rows and for a row range, and the chunked matmul equals the reference."""
    from g906.kernels.linear import packed_gemm
    from g906.kernels.linear.packed_fields import PQ_E

    N, K = 37, 1280                      # an odd row count; 5 super-blocks (masked last vector)
    w = qweight(N, K, qtype, 8)
    p = repack.pack(w.data, qtype, w.shape)
    exact = repack.dequantize_packed(p)
    # A * f + B in fp32 (K-quants: the min folded into B) rounds at the scale of A, not of the
    # weight: errors of ~1e-7 of the row's largest weight, far below fp16's resolution
    tol = 1e-6 * float(exact.abs().max())
    torch.testing.assert_close(packed_gemm.packed_to_dense(p).float(), exact.half().float(), rtol=1e-3, atol=tol)
    torch.testing.assert_close(packed_gemm.packed_to_dense(p, torch.float32, (5, 30)), exact[5:30], rtol=1e-5, atol=tol)
    order = packed_gemm.field_major_order(K, PQ_E[qtype], torch.device("cpu"))
    assert sorted(order.tolist()) == list(range(K))
    torch.testing.assert_close(packed_gemm.packed_to_dense(p, torch.float32, field_major=True),
                               exact[:, order], rtol=1e-5, atol=tol)
    x = randn(24, K, dtype=torch.float16, gen=torch.Generator().manual_seed(3))
    ref = registry.call_reference("linear", x, w)
    from g906.kernels import _triton_util

    monkeypatch.setattr(_triton_util, "DEQUANT_ROWS", 8)
    for chunk in (1 << 25, 8 * K):                                # one block; 5 blocks of 8 rows
        monkeypatch.setattr(_triton_util, "DEQUANT_CHUNK", chunk)
        out = torch.empty((24, N), dtype=torch.float16, device=DEVICE)
        assert_close(packed_gemm._pq_dequant_matmul(x, p, out), ref)


def test_cuda_decode_prefetch_from_iterations():
    """On CUDA a one-token GEMV issues its next iteration's loads early (PREFETCH) where its
    programs make enough whole iterations, else peels the first before the PDL wait
    (PRELOAD): Q4_K from 3 (the 9B's 4096 x 12288 down projection: 66 -> 73% of the copy rate,
    docs/PERF.md E29; its 2-iteration gate/up lost 6 points with it), the others from 4."""
    from g906.kernels.linear import packed_config as K

    def flags(N, K_, qtype):
        c = K._pq_gemv_config(1, N, K_, qtype, torch.device("cpu"))
        kw = K_ // K.PQ_E[qtype]
        kw_len = K._pq_splits(kw, c["SPLIT"])[0]
        return K._pq_loop_flags(kw, kw_len, 32 * c["num_warps"], c["PREFETCH"], True, qtype)

    assert flags(4096, 12288, "Q4_K") == (True, True, False)      # 3 iterations of 4 warps
    assert flags(2048, 6144, "Q4_K") == (True, True, False)       # 3 iterations of 2 warps
    assert flags(24576, 4096, "Q4_K") == (True, False, True)      # gate/up: 2 iterations
    assert flags(2048, 6144, "Q6_K") == (True, False, True)       # 3: unmeasured, peeled
    assert flags(4096, 4096, "Q4_0") == (True, False, True)


@pytest.mark.parametrize("qtype", QTYPES)
def test_rocm_decode_configs(qtype, monkeypatch):
    """ROCm's batch-1 configs (g906/kernels/linear/packed_config.py _pq_rocm_decode, chosen from gfx908 code)
    on a mocked wave64 device, then run (with fewer threads) in the interpreter."""
    from g906.kernels.linear import packed_config as K

    for mod in linear_launchers_with("is_rocm"):
        monkeypatch.setattr(mod, "is_rocm", lambda: True)
    for mod in linear_launchers_with("warp_size"):
        monkeypatch.setattr(mod, "warp_size", lambda device: 64)
    K._pq_gemv_config_cached.cache_clear()
    try:                  # (the cache is keyed by device: CPU calls must not keep ROCm configs)
        c = K._pq_gemv_config(1, 4096, 4096, qtype, torch.device("cpu"))
        c2 = K._pq_gemv_config(2, 4096, 4096, qtype, torch.device("cpu"))
        rows, pairs, wsplit = {"Q4_K": (8, 2, True), "Q4_0": (8, 1, True)}.get(qtype, (4, 1, True))
        # warps: the most whose iteration (4 words x 64 lanes each) divides K's words, but
        # not 2 for Q4_K (more VGPRs than at 1)
        warps = {"Q8_0": 4, "Q4_K": 1}.get(qtype, 2)
        assert (c["BLOCK_N"], c["PAIRS"], c["WSPLIT"], c["ONE_IMM"], c["CVT"], c["num_warps"]) == (
            rows, pairs, wsplit, True, True, warps)
        assert c2["ONE_IMM"] and (c2["BLOCK_T"], c2["BLOCK_N"]) == (2, 4)
        # the 0.8B's K = 1024: 128 words a row in 4-bit types, fewer than a wave's iteration
        # (256), so one wave, the least masked (Q8_0's 256 words: one wave exactly)
        assert K._pq_gemv_config(1, 1024, 1024, qtype, torch.device("cpu"))["num_warps"] == 1
        c16 = K._pq_gemv_config(16, 4096, 4096, qtype, torch.device("cpu"))
        assert (c16["BLOCK_T"], c16["BLOCK_N"]) == (4, 2)        # 4 token blocks, no spills
        # the 35B-A3B shared expert's down projection (K = 512): a row of one word a lane or
        # less runs one row a program at 4 tokens (2 rows spill with the SwiGLU prologue)
        c4 = K._pq_gemv_config(3, 2048, 512, qtype, torch.device("cpu"))
        assert (c4["BLOCK_T"], c4["BLOCK_N"]) == (4, 2 if qtype == "Q8_0" else 1)
        g = torch.Generator().manual_seed(55)
        N, K_ = 13, 768
        w = qweight(N, K_, qtype, 9)
        p = repack.pack(w.data, qtype, w.shape)
        x = randn(1, K_, gen=g)
        cfg = {k: c[k] for k in ("BLOCK_N", "PAIRS", "WSPLIT", "ONE_IMM", "CVT")}
        assert_close(packed_call(x, p, H=8, **cfg), registry.call_reference("linear", x, w))
        x = randn(11, K_, gen=g)                                 # a batch in 3 token blocks
        cfg = {k: c16[k] for k in ("BLOCK_N", "BLOCK_T", "PAIRS", "WSPLIT", "ONE_IMM", "CVT")}
        assert_close(packed_call(x, p, H=8, **cfg), registry.call_reference("linear", x, w))
    finally:
        K._pq_gemv_config_cached.cache_clear()
