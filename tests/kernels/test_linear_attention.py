"""Causal conv1d and the gated delta rule: Triton vs reference (and reference vs recurrence
vs transformers' Qwen3.5 implementation)."""

from __future__ import annotations

import pytest
import torch

from g906.kernels import registry
from g906.kernels.gdn.reference import gated_delta_rule_recurrent, kv_head_index

from .conftest import DEVICE
from .util import assert_close, gpu, needs_gpu, randn, rel_err


def _i32(xs):
    return torch.tensor(xs, dtype=torch.int32, device=DEVICE)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv1d_prefill(dtype):
    g = torch.Generator().manual_seed(20)
    C, K, S = 37, 4, 5
    lens = [1, 6, 2, 4]
    T = sum(lens)
    xz = randn(T, C + 3, dtype=dtype, gen=g)
    x = xz[:, :C]                                            # strided rows, as from a projection
    w = randn(C, K, dtype=dtype, gen=g)
    cu = _i32([0, 1, 7, 9, 13])
    slots = _i32([2, 0, 3, 4])
    init = torch.tensor([True, False, True, False], device=DEVICE)
    first = _i32([5, 0, 2, 0])                 # chunk starts: taps before token 0 read as zero
    st0 = randn(S, C, K, dtype=dtype, gen=g)
    st0[1] = float("nan")                                   # a slot nobody owns stays untouched
    st0[3, :, 3] = float("nan")                             # ring column of token -1: never read
    st_t, st_r = st0.clone(), st0.clone()
    out = registry.call_triton("causal_conv1d_prefill", x, w, cu, st_t, slots, init, first)
    ref = registry.call_reference("causal_conv1d_prefill", x, w, cu, st_r, slots, init, first)
    assert_close(out, ref)
    assert torch.isnan(st_t[1]).all()
    assert torch.equal(st_t.nan_to_num(7.0), st_r.nan_to_num(7.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv1d_decode(dtype):
    g = torch.Generator().manual_seed(21)
    B, C, K, S = 3, 37, 4, 4
    x = randn(B, C, dtype=dtype, gen=g)
    w = randn(C, K, dtype=dtype, gen=g)
    slots = _i32([3, 0, 2])
    lens = _i32([1, 3, 10])                    # tokens 0 and 2: some taps before the sequence
    st0 = randn(S, C, K, dtype=dtype, gen=g)
    st0[3, :, 1:] = float("nan")               # token 0's slot: columns of tokens < 0, unread
    st_t, st_r = st0.clone(), st0.clone()
    out = registry.call_triton("causal_conv1d_decode", x, w, st_t, slots, lens)
    ref = registry.call_reference("causal_conv1d_decode", x, w, st_r, slots, lens)
    assert_close(out, ref)
    assert torch.equal(st_t.nan_to_num(7.0), st_r.nan_to_num(7.0))


@pytest.mark.parametrize("impl", ["triton", "reference"])
def test_conv1d_chunks_then_decode_equal_one_prefill(impl):
    """Prefill in chunks (one shorter than the kernel), then decode steps: the same outputs as
    one prefill of the whole sequence."""
    call = registry.call_triton if impl == "triton" else registry.call_reference
    g = torch.Generator().manual_seed(22)
    C, K = 16, 4
    x = randn(9, C, gen=g)
    w = randn(C, K, gen=g)
    slot = _i32([0])
    no, yes = torch.tensor([False], device=DEVICE), torch.tensor([True], device=DEVICE)
    full = call("causal_conv1d_prefill", x, w, _i32([0, 9]), randn(1, C, K, gen=g), slot, no,
                _i32([0]))
    st = torch.full((1, C, K), float("nan"), device=DEVICE)    # a fresh slot's ring is never read
    y = [call("causal_conv1d_prefill", x[:4], w, _i32([0, 4]), st, slot, no, _i32([0])),
         call("causal_conv1d_prefill", x[4:6], w, _i32([0, 2]), st, slot, yes, _i32([4]))]
    y += [call("causal_conv1d_decode", x[i:i + 1], w, st, slot, _i32([i + 1])) for i in (6, 7, 8)]
    assert_close(torch.cat(y), full)


def _gdn_inputs(T, Hk, Hv, Dk, Dv, dtype, gen):
    q = randn(T, Hk, Dk, dtype=dtype, gen=gen)
    k = randn(T, Hk, Dk, dtype=dtype, gen=gen)
    v = randn(T, Hv, Dv, dtype=dtype, gen=gen)
    a = randn(T, Hv, dtype=dtype, gen=gen)
    b = randn(T, Hv, dtype=dtype, gen=gen)
    A_log = randn(Hv, gen=gen, scale=0.5)
    dt_bias = randn(Hv, gen=gen, scale=0.5)
    return q, k, v, a, b, A_log, dt_bias


@pytest.mark.parametrize("order", ["grouped", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gdn_decode(order, dtype):
    g = torch.Generator().manual_seed(30)
    B, Hk, Hv, Dk, Dv, S = 3, 2, 4, 16, 24, 5
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(B, Hk, Hv, Dk, Dv, dtype, g)
    st0 = randn(S, Hv, Dk, Dv, gen=g, scale=0.3)
    st0[1] = float("nan")
    st_t, st_r = st0.clone(), st0.clone()
    slots = _i32([2, 0, 4])
    o_t = registry.call_triton("gated_delta_rule_decode", q, k, v, a, b, A_log, dt_bias, st_t, slots,
                               v_head_order=order)
    o_r = registry.call_reference("gated_delta_rule_decode", q, k, v, a, b, A_log, dt_bias, st_r,
                                  slots, v_head_order=order)
    assert_close(o_t, o_r)
    assert torch.isnan(st_t[1]).all()
    assert_close(st_t[[0, 2, 3, 4]], st_r[[0, 2, 3, 4]], tol=1e-5)


def _conv_gdn_inputs(B, Hk, Hv, Dk, Dv, K, S, dtype, gen):
    """Raw projection rows [q | k | v | extra columns] (as the fused projection's output),
    conv weights and rings, a, b, A_log, dt_bias, recurrent states."""
    C = 2 * Hk * Dk + Hv * Dv
    proj = randn(B, C + 2 * Hv + 5, dtype=dtype, gen=gen)
    qkv, a, b = proj[:, :C], proj[:, C:C + Hv], proj[:, C + Hv:C + 2 * Hv]
    w = randn(C, K, dtype=dtype, gen=gen, scale=0.5)
    rings = randn(S, C, K, dtype=dtype, gen=gen)
    A_log = randn(Hv, gen=gen, scale=0.5)
    dt_bias = randn(Hv, gen=gen, scale=0.5)
    st = randn(S, Hv, Dk, Dv, gen=gen, scale=0.3)
    return qkv, w, rings, a, b, A_log, dt_bias, st


def _conv_gdn_both(qkv, w, rings, lens, a, b, A_log, dt_bias, st, slots, Hk, Dk, order):
    """(Triton output, reference output, their rings, their states), each on its own copies."""
    r_t, r_r, s_t, s_r = rings.clone(), rings.clone(), st.clone(), st.clone()
    kw = dict(num_k_heads=Hk, head_k_dim=Dk, v_head_order=order)
    o_t = registry.call_triton("conv_gated_delta_rule_decode", qkv, w, r_t, lens, a, b, A_log,
                               dt_bias, s_t, slots, **kw)
    o_r = registry.call_reference("conv_gated_delta_rule_decode", qkv, w, r_r, lens, a, b, A_log,
                                  dt_bias, s_r, slots, **kw)
    return o_t, o_r, r_t, r_r, s_t, s_r


@pytest.mark.parametrize("order", ["grouped", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv_gdn_decode(order, dtype):
    """The conv step inside the recurrent step's kernel: several programs share each key head's
    q/k channels (2 value heads x 2 value blocks here), one writes their ring."""
    g = torch.Generator().manual_seed(31)
    B, Hk, Hv, Dk, Dv, K, S = 3, 2, 4, 16, 24, 4, 5
    qkv, w, rings, a, b, A_log, dt_bias, st0 = _conv_gdn_inputs(B, Hk, Hv, Dk, Dv, K, S, dtype, g)
    st0[1] = float("nan")
    slots, lens = _i32([2, 0, 4]), _i32([7, 2, 1])
    rings[4, :, 1:] = float("nan")              # ring columns of tokens < 0: never read
    rings[0, :, 2:] = float("nan")
    o_t, o_r, r_t, r_r, s_t, s_r = _conv_gdn_both(qkv, w, rings, lens, a, b, A_log, dt_bias,
                                                  st0, slots, Hk, Dk, order)
    assert_close(o_t, o_r)
    assert torch.equal(r_t.nan_to_num(7.0), r_r.nan_to_num(7.0))
    assert torch.isnan(s_t[1]).all()
    assert_close(s_t[[0, 2, 3, 4]], s_r[[0, 2, 3, 4]], tol=1e-5)
    # and the same as the two separate kernels
    r2, s2 = rings.clone(), st0.clone()
    y = registry.call_triton("causal_conv1d_decode", qkv, w, r2, slots, lens)
    kd = Hk * Dk
    o2 = registry.call_triton("gated_delta_rule_decode", y[:, :kd].reshape(B, Hk, Dk),
                              y[:, kd:2 * kd].reshape(B, Hk, Dk), y[:, 2 * kd:].reshape(B, Hv, Dv),
                              a, b, A_log, dt_bias, s2, slots, v_head_order=order)
    assert_close(o_t, o2, tol=1e-6)
    assert torch.equal(r_t.nan_to_num(7.0), r2.nan_to_num(7.0))


def _gated_norm_inputs(B, Hv, Dv, dtype, gen):
    """z as the [B, Hv, Dv] view of a wider projection output (row stride past Hv * Dv), and the
    norm's weight."""
    z = randn(B, Hv * Dv + 7, dtype=dtype, gen=gen)[:, :Hv * Dv].view(B, Hv, Dv)
    return z, randn(Dv, dtype=dtype, gen=gen) + 1.0


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_conv_gdn_decode_gated_norm(dtype):
    """The gated RMSNorm applied by the last of each head's programs to store its columns: one
    program a head, two and four (the arrival counters are shared, calls alternate the count),
    against the reference's gated_delta_rule then gated_rms_norm; repeated calls keep the
    counters at multiples of 64."""
    from g906.kernels._triton_util import arrival_counters

    g = torch.Generator().manual_seed(36)
    B, Hk, Hv, Dk, Dv, K, S = 3, 2, 4, 16, 32, 4, 5
    qkv, w, rings, a, b, A_log, dt_bias, st0 = _conv_gdn_inputs(B, Hk, Hv, Dk, Dv, K, S, dtype, g)
    z, nw = _gated_norm_inputs(B, Hv, Dv, dtype, g)
    slots, lens = _i32([2, 0, 4]), _i32([7, 2, 1])
    kw = dict(num_k_heads=Hk, head_k_dim=Dk, v_head_order="tiled", gated_norm=(z, nw, 1e-6))
    r_r, s_r = rings.clone(), st0.clone()
    o_r = registry.call_reference("conv_gated_delta_rule_decode", qkv, w, r_r, lens, a, b, A_log,
                                  dt_bias, s_r, slots, **kw)
    o_plain = registry.call_reference("conv_gated_delta_rule_decode", qkv, w, rings.clone(), lens,
                                      a, b, A_log, dt_bias, st0.clone(), slots,
                                      num_k_heads=Hk, head_k_dim=Dk, v_head_order="tiled")
    assert rel_err(o_r, o_plain) > 0.1                      # the norm changes the output
    for block_v in (32, 16, 8, 16):
        r_t, s_t = rings.clone(), st0.clone()
        o_t = registry.call_triton("conv_gated_delta_rule_decode", qkv, w, r_t, lens, a, b, A_log,
                                   dt_bias, s_t, slots, block_v=block_v, **kw)
        assert_close(o_t, o_r)
        assert torch.equal(r_t, r_r)
        assert_close(s_t, s_r, tol=1e-5)
        assert not (arrival_counters(o_t.device, B * Hv)[:B * Hv] % 64).any()


PREFILL_CASES = [  # lens, chunk_size
    ([1, 20, 37], 16),
    ([70], 64),
]


@pytest.mark.parametrize("lens,chunk", PREFILL_CASES)
@pytest.mark.parametrize("order", ["grouped", "tiled"])
def test_gdn_prefill(lens, chunk, order):
    g = torch.Generator().manual_seed(31)
    Hk, Hv, Dk, Dv, S = 2, 4, 16, 24, 5
    T = sum(lens)
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(T, Hk, Hv, Dk, Dv, torch.float32, g)
    cu = _i32([0] + torch.tensor(lens).cumsum(0).tolist())
    B = len(lens)
    slots = _i32([3, 0, 4][:B])
    init = torch.tensor([True, False, True][:B], device=DEVICE)
    st0 = randn(S, Hv, Dk, Dv, gen=g, scale=0.3)
    st0[1] = float("nan")
    sts = [st0.clone() for _ in range(3)]
    args = (q, k, v, a, b, A_log, dt_bias, cu)
    o_t = registry.call_triton("gated_delta_rule_prefill", *args, sts[0], slots, init,
                               v_head_order=order, chunk_size=chunk)
    o_r = registry.call_reference("gated_delta_rule_prefill", *args, sts[1], slots, init,
                                  v_head_order=order, chunk_size=chunk)
    o_rec = gated_delta_rule_recurrent(*args, sts[2], slots, init, v_head_order=order)
    assert_close(o_r, o_rec)
    assert_close(o_t, o_r)
    used = slots.tolist()
    assert_close(sts[1][used], sts[2][used])
    assert_close(sts[0][used], sts[1][used])
    assert torch.isnan(sts[0][1]).all()


@pytest.mark.parametrize("order", ["grouped", "tiled"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_gdn_recurrent_short_sequences(order, dtype):
    """The token-by-token kernel for verify steps: several short sequences (one empty, one
    fresh), strided rows, states through slots; equal to the chunked kernel and the references."""
    from g906.engine.layers.reference import gated_delta_rule_recurrent as independent

    g = torch.Generator().manual_seed(37)
    Hk, Hv, Dk, Dv, S = 2, 4, 16, 24, 6
    lens = [4, 1, 0, 3, 2]
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(sum(lens), Hk, Hv, Dk, Dv, dtype, g)
    cu = _i32([0] + torch.tensor(lens).cumsum(0).tolist())
    slots = _i32([3, 0, 5, 2, 4])
    init = torch.tensor([True, True, True, False, True], device=DEVICE)
    st0 = randn(S, Hv, Dk, Dv, gen=g, scale=0.3)
    st0[1] = float("nan")
    sts = [st0.clone() for _ in range(4)]
    args = (q, k, v, a, b, A_log, dt_bias, cu)
    o_t = registry.call_triton("gated_delta_rule_recurrent", *args, sts[0], slots, init, v_head_order=order)
    o_r = registry.call_reference("gated_delta_rule_recurrent", *args, sts[1], slots, init, v_head_order=order)
    o_c = registry.call_triton("gated_delta_rule_prefill", *args, sts[2], slots, init, v_head_order=order,
                               chunk_size=16)
    o_i = independent(*args, sts[3], slots, init, v_head_order=order)
    used = slots.tolist()
    for o, st in ((o_r, sts[1]), (o_c, sts[2]), (o_i, sts[3])):
        assert_close(o_t, o)
        assert_close(sts[0][used], st[used])
    assert torch.isnan(sts[0][1]).all()
    assert_close(sts[0][5], st0[5])        # an empty sequence keeps its state


def test_gdn_prefill_several_tiles():
    # Dk, Dv not multiples of 16 (several key/value tiles, the last partly masked), an empty
    # sequence, chunk 32, state read and written through strided slots
    g = torch.Generator().manual_seed(36)
    Hk, Hv, Dk, Dv = 1, 2, 40, 40
    lens = [33, 0, 71]
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(sum(lens), Hk, Hv, Dk, Dv, torch.float32, g)
    cu = _i32([0] + torch.tensor(lens).cumsum(0).tolist())
    slots, init = _i32([1, 2, 0]), torch.tensor([True, True, False], device=DEVICE)
    st0 = randn(3, Hv, Dk, Dv, gen=g, scale=0.3)
    s_t, s_r = st0.clone(), st0.clone()
    args = (q, k, v, a, b, A_log, dt_bias, cu)
    o_t = registry.call_triton("gated_delta_rule_prefill", *args, s_t, slots, init, chunk_size=32,
                               block_v=32)
    o_r = gated_delta_rule_recurrent(*args, s_r, slots, init)
    assert_close(o_t, o_r)
    assert_close(s_t, s_r)


def test_gdn_prefill_fp16_inputs():
    g = torch.Generator().manual_seed(32)
    Hk, Hv, Dk, Dv = 1, 2, 16, 16
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(21, Hk, Hv, Dk, Dv, torch.float16, g)
    cu, slots, init = _i32([0, 21]), _i32([0]), torch.tensor([False], device=DEVICE)
    st = [torch.zeros(1, Hv, Dk, Dv, device=DEVICE) for _ in range(2)]
    args = (q, k, v, a, b, A_log, dt_bias, cu)
    o_t = registry.call_triton("gated_delta_rule_prefill", *args, st[0], slots, init, chunk_size=16)
    o_r = registry.call_reference("gated_delta_rule_prefill", *args, st[1], slots, init, chunk_size=16)
    assert_close(o_t, o_r)


def test_gdn_prefill_then_decode_equals_recurrence():
    g = torch.Generator().manual_seed(33)
    Hk, Hv, Dk, Dv = 1, 2, 16, 16
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(19, Hk, Hv, Dk, Dv, torch.float32, g)
    slots, init = _i32([0]), torch.tensor([False], device=DEVICE)
    st = torch.zeros(1, Hv, Dk, Dv, device=DEVICE)
    o1 = registry.call_triton("gated_delta_rule_prefill", q[:17], k[:17], v[:17], a[:17], b[:17],
                              A_log, dt_bias, _i32([0, 17]), st, slots, init, chunk_size=16)
    o2 = [registry.call_triton("gated_delta_rule_decode", q[i:i + 1], k[i:i + 1], v[i:i + 1],
                               a[i:i + 1], b[i:i + 1], A_log, dt_bias, st, slots) for i in (17, 18)]
    st_ref = torch.zeros(1, Hv, Dk, Dv, device=DEVICE)
    ref = gated_delta_rule_recurrent(q, k, v, a, b, A_log, dt_bias, _i32([0, 19]), st_ref, slots, init)
    assert_close(torch.cat([o1] + o2), ref)
    assert_close(st, st_ref)


def test_reference_matches_transformers():
    mod = pytest.importorskip("transformers.models.qwen3_5.modeling_qwen3_5")
    import torch.nn.functional as F

    g = torch.Generator().manual_seed(34)
    Hk, Hv, Dk, Dv, L = 2, 4, 16, 24, 45
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(L, Hk, Hv, Dk, Dv, torch.float32, g)
    q, k, v, a, b, A_log, dt_bias = (t.cpu() for t in (q, k, v, a, b, A_log, dt_bias))
    st = torch.randn(1, Hv, Dk, Dv, generator=g) * 0.3
    beta = b.sigmoid()
    gg = -A_log.exp() * F.softplus(a + dt_bias)
    # expand key heads to value heads in HF's grouped order (older transformers need it done)
    qe, ke = (t.repeat_interleave(Hv // Hk, dim=1) for t in (q, k))
    hf_o, hf_s = mod.torch_chunk_gated_delta_rule(
        qe[None], ke[None], v[None], g=gg[None], beta=beta[None], chunk_size=16,
        initial_state=st.clone(), output_final_state=True, use_qk_l2norm_in_kernel=True)
    mine_st = st.clone()
    o = registry.call_reference("gated_delta_rule_prefill", q, k, v, a, b, A_log, dt_bias,
                                torch.tensor([0, L], dtype=torch.int32), mine_st,
                                torch.tensor([0], dtype=torch.int32), torch.tensor([True]),
                                v_head_order="grouped", chunk_size=16)
    assert_close(o, hf_o[0])
    assert_close(mine_st, hf_s)


def test_tiled_order_is_a_head_permutation_of_grouped():
    # v head j in tiled order uses k head j % Hk; permuting v-side tensors maps one to the other
    Hk, Hv = 2, 6
    grouped = kv_head_index(Hv, Hk, "grouped").tolist()
    tiled = kv_head_index(Hv, Hk, "tiled").tolist()
    assert grouped == [0, 0, 0, 1, 1, 1] and tiled == [0, 1, 0, 1, 0, 1]


@gpu
@needs_gpu
@pytest.mark.parametrize("order", ["grouped", "tiled"])
def test_gdn_real_shapes(order):
    g = torch.Generator().manual_seed(35)
    Hk, Hv, Dk, Dv = 16, 32, 128, 128        # Qwen3.5-9B linear-attention layer
    lens = [300, 1, 1100]
    T = sum(lens)
    q, k, v, a, b, A_log, dt_bias = _gdn_inputs(T, Hk, Hv, Dk, Dv, torch.float16, g)
    cu = _i32([0] + torch.tensor(lens).cumsum(0).tolist())
    slots, init = _i32([2, 0, 1]), torch.tensor([True, False, True], device=DEVICE)
    st0 = randn(3, Hv, Dk, Dv, gen=g, scale=0.1)
    s1, s2 = st0.clone(), st0.clone()
    args = (q, k, v, a, b, A_log, dt_bias, cu)
    o_t = registry.call_triton("gated_delta_rule_prefill", *args, s1, slots, init, v_head_order=order)
    o_r = registry.call_reference("gated_delta_rule_prefill", *args, s2, slots, init, v_head_order=order)
    assert_close(o_t, o_r)
    assert_close(s1, s2, tol=1e-4)
    short = [4, 2, 1, 4]                          # a verify step's rows: 1 + k tokens a sequence
    cs = _i32([0] + torch.tensor(short).cumsum(0).tolist())
    rows = (q[:11], k[:11], v[:11], a[:11], b[:11], A_log, dt_bias, cs)
    sl4, init4 = _i32([2, 0, 1, 3]), torch.tensor([True, True, True, True], device=DEVICE)
    st4 = randn(4, Hv, Dk, Dv, gen=g, scale=0.1)
    s1, s2 = st4.clone(), st4.clone()
    o_t = registry.call_triton("gated_delta_rule_recurrent", *rows, s1, sl4, init4, v_head_order=order)
    o_r = registry.call_reference("gated_delta_rule_recurrent", *rows, s2, sl4, init4, v_head_order=order)
    assert_close(o_t, o_r)
    assert_close(s1, s2, tol=1e-5)
    B = 32
    qd, kd, vd, ad, bd, _, _ = _gdn_inputs(B, Hk, Hv, Dk, Dv, torch.float16, g)
    sd = randn(B, Hv, Dk, Dv, gen=g, scale=0.1)
    s1, s2 = sd.clone(), sd.clone()
    sl = torch.randperm(B, generator=g).to(torch.int32).to(DEVICE)
    o_t = registry.call_triton("gated_delta_rule_decode", qd, kd, vd, ad, bd, A_log, dt_bias, s1, sl,
                               v_head_order=order)
    o_r = registry.call_reference("gated_delta_rule_decode", qd, kd, vd, ad, bd, A_log, dt_bias, s2,
                                  sl, v_head_order=order)
    assert_close(o_t, o_r)
    assert_close(s1, s2, tol=1e-5)
    qkv, w, rings, a, b, A_log, dt_bias, sd = _conv_gdn_inputs(B, Hk, Hv, Dk, Dv, 4, B,
                                                               torch.float16, g)
    lens = torch.randint(1, 5000, (B,), generator=g).to(torch.int32).to(DEVICE)
    o_t, o_r, r1, r2, s1, s2 = _conv_gdn_both(qkv, w, rings, lens, a, b, A_log, dt_bias, sd, sl,
                                              Hk, Dk, order)
    assert_close(o_t, o_r)
    assert torch.equal(r1, r2)
    assert_close(s1, s2, tol=1e-5)
    z, nw = _gated_norm_inputs(B, Hv, Dv, torch.float16, g)
    for bsz in (1, B):                           # 16- and 32-column programs (8 and 4 a head)
        kw = dict(num_k_heads=Hk, head_k_dim=Dk, v_head_order=order, gated_norm=(z[:bsz], nw, 1e-6))
        one = (qkv[:bsz], w, rings.clone(), lens[:bsz], a[:bsz], b[:bsz], A_log, dt_bias)
        for _ in range(3):
            o_t = registry.call_triton("conv_gated_delta_rule_decode", *one, sd.clone(), sl[:bsz], **kw)
            o_r = registry.call_reference("conv_gated_delta_rule_decode", *one, sd.clone(), sl[:bsz],
                                          **kw)
            assert_close(o_t, o_r)
