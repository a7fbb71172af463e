"""Benchmark g906.kernels on real Qwen3.5 layer shapes against the PyTorch references.

    python benchmarks/kernel_bench.py [--quick] [--only gemv,qgemv,decode,gdn,...] [--json out.json]
    python benchmarks/kernel_bench.py --only linear-quant     # repacked vs GGUF-block dequant-GEMV

Measures the device's copy bandwidth first (a large device-to-device copy, bytes read +
written), then for every kernel prints time (median, CUDA-graph replay for the Triton
kernels so launch gaps do not count), the bytes it must move at least, achieved GB/s, % of the
copy bandwidth, and the same for the PyTorch reference. Needs a GPU (CUDA or ROCm).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

import triton  # noqa: E402
import triton.testing  # noqa: E402

from g906.engine.weights import QuantizedTensor  # noqa: E402
from g906.kernels import ops, registry  # noqa: E402,F401
from g906.kernels.linear import dense, gguf_matmul, packed, packed_config  # noqa: E402
from g906.kernels.linear.gguf_blocks import BLOCKS  # noqa: E402

# Qwen3.5 text shapes (HF config.json: hidden, intermediate, q heads, kv heads, head_dim,
# linear-attention k heads / v heads, head dims 128).
MODELS = {
    "0.8B": dict(hidden=1024, inter=3584, hq=8, hk=2, hd=256, lk=16, lv=16),
    "9B": dict(hidden=4096, inter=12288, hq=16, hk=4, hd=256, lk=16, lv=32),
    "27B": dict(hidden=5120, inter=17408, hq=24, hk=4, hd=256, lk=16, lv=48),
}
ROWS: list[dict] = []
COPY_BW = 0.0


def bench_graph(fn, rep=100):
    """Median ms of fn replayed in a CUDA graph (falls back to plain do_bench)."""
    fn()
    torch.cuda.synchronize()
    try:
        return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
    except Exception:
        return triton.testing.do_bench(fn, warmup=25, rep=rep, return_mode="median")


def bench_plain(fn, rep=100):
    fn()
    torch.cuda.synchronize()
    return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")


def copy_bandwidth():
    n = 2 * 1024 ** 3 // 2
    a = torch.randn(n, dtype=torch.float16, device="cuda")
    b = torch.empty_like(a)
    ms = bench_plain(lambda: b.copy_(a), rep=200)
    bw = 2 * a.numel() * 2 / (ms * 1e-3) / 1e9
    del a, b
    torch.cuda.empty_cache()
    return bw


def record(group, name, nbytes, ms_kernel, ms_ref=None, note="", flops=None):
    gbs = nbytes / (ms_kernel * 1e-3) / 1e9
    row = dict(group=group, name=name, bytes=nbytes, ms=ms_kernel, gbs=gbs,
               pct=100 * gbs / COPY_BW, note=note)
    if ms_ref is not None:
        row["ref_ms"] = ms_ref
        row["ref_gbs"] = nbytes / (ms_ref * 1e-3) / 1e9
        row["ref_pct"] = 100 * row["ref_gbs"] / COPY_BW
    if flops is not None:
        row["tflops"] = flops / (ms_kernel * 1e-3) / 1e12
    ROWS.append(row)
    ref = (f"  ref {ms_ref * 1e3:9.1f} us {row['ref_gbs']:7.0f} GB/s {row['ref_pct']:5.1f}%"
           if ms_ref is not None else "")
    tf = f"  {row['tflops']:.1f} TFLOP/s" if flops is not None else ""
    print(f"{group:8s} {name:44s} {ms_kernel * 1e3:9.1f} us {gbs:7.0f} GB/s {row['pct']:5.1f}%"
          f"{ref}{tf} {note}", flush=True)


def rand_blocks(rows, cols, qtype):
    """Random GGUF blocks with finite fp16 scales (bytes elsewhere random), on the GPU."""
    be, bb = BLOCKS[qtype]
    nb = rows * cols // be
    raw = torch.randint(0, 256, (nb, bb), dtype=torch.uint8, device="cuda")
    def put(off, lo, hi):
        v = (torch.rand(nb, device="cuda") * (hi - lo) + lo).half()
        raw[:, off:off + 2] = v.view(torch.uint8).view(nb, 2)
    if qtype in ("Q8_0", "Q4_0"):
        put(0, -0.02, 0.02)
    elif qtype in ("Q4_K", "Q5_K"):
        put(0, 0.0, 0.003)
        put(2, 0.0, 0.003)
    elif qtype == "Q6_K":
        put(208, -0.002, 0.002)
    return QuantizedTensor(raw.view(rows, cols // be * bb), qtype, (rows, cols))


def bench_gemv(quick):
    # [out, in]; 248320 x hidden: the LM head, 11% of the 9B's decode bytes
    shapes = [("9B", 12288, 4096), ("9B", 4096, 12288), ("9B", 248320, 4096)]
    if not quick:
        shapes += [("0.8B", 3584, 1024), ("0.8B", 1024, 3584), ("0.8B", 248320, 1024),
                   ("27B", 17408, 5120), ("27B", 5120, 17408)]
    sweep = [dict(BLOCK_N=n, BLOCK_K=k, num_warps=w) for n, k, w in
             ((16, 256, 4), (4, 512, 4), (8, 512, 4), (4, 1024, 8))]
    for model, N, K in shapes:
        w = torch.randn(N, K, dtype=torch.float16, device="cuda") * 0.02
        for T in (1, 8, 32):
            x = torch.randn(T, K, dtype=torch.float16, device="cuda")
            nbytes = N * K * 2 + T * (K + N) * 2
            ms_ref = bench_graph(lambda: x @ w.t())
            ms = bench_graph(lambda: registry.call_triton("linear", x, w))
            note = "(cuBLAS, T>16)" if T > 16 else ""
            best = ""
            if T == 1 and (model == "9B" or not quick):
                results = []
                for cfg in sweep:
                    try:
                        t = bench_graph(lambda: dense.dense_gemv(x, w, **cfg))
                        results.append((t, cfg))
                    except Exception as e:  # a config may not compile on every target
                        print("   config", cfg, "failed:", type(e).__name__)
                results.sort(key=lambda r: r[0])
                if results:
                    ms = min(ms, results[0][0])
                    best = f"best {results[0][1]}"
            record("gemv", f"{model} fp16 {N}x{K} T={T}", nbytes, ms, ms_ref, note or best)
        del w


def bench_qgemv(quick):
    types = ["Q8_0", "Q4_K", "Q6_K", "Q5_K", "Q4_0"]
    shapes = [("9B", 12288, 4096), ("9B", 4096, 12288)]
    if not quick:
        shapes += [("27B", 17408, 5120), ("27B", 5120, 17408)]
    sweep = [dict(BLOCK_N=n, UNROLL=u, num_warps=w) for n, u, w in
             ((4, 8, 4), (2, 8, 4), (8, 4, 4), (4, 4, 4), (4, 8, 8))]
    for model, N, K in shapes:
        for qt in types:
            if model == "27B" and qt not in ("Q4_K", "Q6_K"):
                continue
            w = rand_blocks(N, K, qt)
            for T in (1, 8, 32):
                x = torch.randn(T, K, dtype=torch.float16, device="cuda")
                nbytes = w.nbytes + T * (K + N) * 2
                ms_ref = bench_plain(lambda: registry.call_reference("linear", x, w), rep=50) \
                    if T == 1 else None
                ms = bench_graph(lambda: registry.call_triton("linear", x, w))
                best = ""
                if T == 1 and model == "9B":
                    results = []
                    for cfg in sweep:
                        try:
                            t = bench_graph(lambda: gguf_matmul.quant_matmul(x, w, **dict(cfg)))
                            results.append((t, cfg))
                        except Exception as e:
                            print("   config", cfg, "failed:", type(e).__name__)
                    results.sort(key=lambda r: r[0])
                    if results:
                        ms = min(ms, results[0][0])
                        best = f"best {results[0][1]}"
                note = "(tiled GEMM)" if T > 16 else best
                flops = 2 * T * N * K if T > 16 else None
                record("qgemv", f"{model} {qt} {N}x{K} T={T}", nbytes, ms, ms_ref, note, flops)
            del w


LINQ_SHAPES = [(4096, 12288), (12288, 4096), (4096, 4096)]   # 9B [out, in]: down, gate/up, attn
LINQ_TYPES = ["Q8_0", "Q4_K", "Q6_K"]                         # --types adds Q5_K, Q4_0


def _l2_bytes():
    return int(getattr(torch.cuda.get_device_properties(torch.cuda.current_device()),
                       "L2_cache_size", 64 << 20))


def linq_extra(qt, base: dict) -> list[dict]:
    """Configs a T = 1 linear-quant sweep runs besides its grid: the base config with the
    other field decodes named explicitly (4-bit fields singly 0, paired 1, paired with
    Q4_K's folded scales 2; Q4_K / Q5_K / Q6_K's fp32 fields beside the packed fp16 that
    _pq_pairs picks for the grid's 8-row entries), and the words of a vector split or not
    (Q6_K and Q4_K's PAIRS = 2 always split)."""
    extra = ([dict(base, PAIRS=p) for p in (0, 1, 2)] if qt == "Q4_K" else
             [dict(base, PAIRS=0)] if qt == "Q4_0" else
             [dict(base, PAIRS=1)] if qt in ("Q5_K", "Q6_K") else [])
    if qt in ("Q8_0", "Q4_0", "Q5_K"):
        extra.append(dict(base, PAIRS=1, WSPLIT=not base["WSPLIT"]) if qt == "Q5_K"
                     else dict(base, WSPLIT=not base["WSPLIT"]))
    if torch.version.hip:   # the gfx9 code choices (docs/PERF.md "gfx9 code")
        extra += [dict(base, ONE_IMM=False, CVT=False), dict(base, CVT=False)]
    return extra


def _run_pairs(x, qt, base: dict, cfg: dict) -> int:
    """The PAIRS a packed GEMV with `cfg` over `base` runs (linear.packed_config._pq_pairs)."""
    return packed_config._pq_pairs(x, qt, dict(base, **cfg), "PAIRS" in cfg)


def sweep_label(cfg: dict, pairs: int | None) -> str:
    """A sweep entry's values joined by '/', and '/p3' where the kernel ran its fields in
    packed fp16 without the entry naming PAIRS (the grid's 8-row Q4_K / Q5_K / Q6_K
    entries)."""
    label = "/".join(str(v) for v in cfg.values())
    return f"{label}/p3" if pairs == 3 and "PAIRS" not in cfg else label


def bench_linear_quant(quick):
    """Dequant-GEMV on GGUF blocks (old kernel) vs on the load-time repacked planes (new,
    g906/kernels/linear/repack.py), 9B decode shapes, T = 1 and 8. Each timing cycles through enough
    distinct copies of the weight (> 4x the L2 cache) inside one CUDA graph, so weights come from
    HBM as in a decode step; time = graph time / copies. GB/s counts the GGUF bytes (+ x, out)."""
    from g906.kernels.linear import repack

    types = LINQ_TYPES
    shapes = LINQ_SHAPES
    # T = 1 grid: rows per program x warps x register prefetch (and the 4-bit field pairing off)
    sweep = [dict(BLOCK_N=bn, num_warps=w, PREFETCH=pf) for bn in (4, 8, 16) for w in (1, 2, 4)
             for pf in (False, True)]
    # T = 8 takes the tensor-core tile path on CUDA (BLOCK_M = 16); a few tile shapes
    sweep_dot = [dict(BLOCK_N=64, H=8, num_warps=4), dict(BLOCK_N=128, H=8, num_warps=8)]
    import time

    t_start = time.perf_counter()
    l2 = _l2_bytes()
    print(f"# linear-quant: L2 {l2 >> 20} MiB; weights rotate through >= 4x L2 of copies; "
          "old = GGUF-block kernel, new = repacked (g906/kernels/linear/repack.py)")
    for N, K in shapes:
        for qt in types:
            w0 = rand_blocks(N, K, qt)
            ncopy = max(2, -(-4 * l2 // w0.nbytes))
            raws = [w0] + [rand_blocks(N, K, qt) for _ in range(ncopy - 1)]
            packs = [repack.pack(w.data, qt, w.shape) for w in raws]
            over = packs[0].nbytes / w0.nbytes
            for T in (1, 8):
                x = torch.randn(T, K, dtype=torch.float16, device="cuda")
                nbytes = w0.nbytes + T * (K + N) * 2
                # same result from both kernels (sanity, not a test)
                a = gguf_matmul.quant_matmul(x, raws[0]).float()
                b = packed.packed_matmul(x, packs[0]).float()
                err = float((a - b).norm() / a.norm().clamp_min(1e-30))

                def old():
                    for w in raws:
                        gguf_matmul.quant_matmul(x, w)

                def run_new(cfg):
                    def f():
                        for p in packs:
                            packed.packed_matmul(x, p, **cfg)
                    return bench_graph(f, rep=50) / ncopy

                ms_old = bench_graph(old, rep=50) / ncopy
                ms_new = run_new({})
                base = packed_config._pq_gemv_config(T, N, K, qt, x.device)
                cfg_note = (f"default {dict(base, PAIRS=_run_pairs(x, qt, base, {}))}"
                            if T == 1 or torch.version.hip else "default (dot path)")
                if not quick and (T == 1 or (N, K) == shapes[0]):
                    res = []
                    for cfg in (sweep + linq_extra(qt, base) if T == 1 else sweep_dot):
                        try:
                            res.append((run_new(cfg), cfg))
                        except Exception as e:  # a config may not compile on every target
                            print("   config", cfg, "failed:", type(e).__name__)
                    res.sort(key=lambda r: r[0])
                    if res:
                        cfg_note += f"; sweep best {res[0][1]} {res[0][0] * 1e3:.1f} us"
                        cfg_note += " (" + ", ".join(
                            sweep_label(c, _run_pairs(x, qt, base, c) if T == 1 else None)
                            + f" {t * 1e3:.1f}" for t, c in res) + ")"
                gb_old = nbytes / (ms_old * 1e-3) / 1e9
                gb_new = nbytes / (ms_new * 1e-3) / 1e9
                name = f"9B {qt} {N}x{K} T={T}"
                ROWS.append(dict(group="linear-quant", name=name, bytes=nbytes, ms=ms_new,
                                 gbs=gb_new, pct=100 * gb_new / COPY_BW, ref_ms=ms_old,
                                 ref_gbs=gb_old, ref_pct=100 * gb_old / COPY_BW,
                                 note=cfg_note, overhead=over, rel_err=err))
                print(f"linq  {name:28s} old {ms_old * 1e3:7.1f} us {gb_old:6.0f} GB/s "
                      f"{100 * gb_old / COPY_BW:5.1f}% | new {ms_new * 1e3:7.1f} us "
                      f"{gb_new:6.0f} GB/s {100 * gb_new / COPY_BW:5.1f}%  x{ms_old / ms_new:4.1f}"
                      f"  bytes x{over:.3f} err {err:.1e}  {cfg_note}", flush=True)
            del raws, packs, w0
            torch.cuda.empty_cache()
    print(f"# linear-quant done in {time.perf_counter() - t_start:.0f} s", flush=True)


def _paged(B, ctx, hk, D, bs=16):
    nblk = ctx // bs
    total = B * nblk
    kc = torch.randn(total, bs, hk, D, dtype=torch.float16, device="cuda")
    vc = torch.randn(total, bs, hk, D, dtype=torch.float16, device="cuda")
    tables = torch.randperm(total, device="cuda").view(B, nblk).to(torch.int32)
    sl = torch.full((B,), ctx, dtype=torch.int32, device="cuda")
    return kc, vc, tables, sl


def bench_decode_attention(quick):
    models = ["9B"] if quick else ["0.8B", "9B", "27B"]
    for model in models:
        m = MODELS[model]
        for B in (1, 8, 32):
            for ctx in (1024, 8192, 32768):
                kc, vc, tables, sl = _paged(B, ctx, m["hk"], m["hd"])
                q = torch.randn(B, m["hq"], m["hd"], dtype=torch.float16, device="cuda")
                gate = torch.randn_like(q)
                scale = m["hd"] ** -0.5
                nbytes = 2 * B * ctx * m["hk"] * m["hd"] * 2 + 3 * q.numel() * 2
                def attn(tab=tables, **cfg):   # graph time of the Triton op with cfg
                    return bench_graph(lambda: registry.call_triton(
                        "paged_decode_attention", q, kc, vc, tab, sl, scale, gate=gate, **cfg))

                ms = attn()
                best = ""
                if model == "9B" and (ctx == 32768 or B == 32):
                    res = []
                    for bn, nw, ps in ((32, 4, 4), (64, 4, 4), (16, 4, 4), (32, 8, 4), (64, 8, 4),
                                       (32, 4, 8), (32, 4, 2), (64, 8, 8), (16, 2, 8)):
                        try:
                            res.append((attn(block_n=bn, num_warps=nw, per_sm=ps), (bn, nw, ps)))
                        except Exception as e:
                            print("   config", (bn, nw, ps), "failed:", type(e).__name__)
                    res.sort(key=lambda r: r[0])
                    if res:
                        ms = min(ms, res[0][0])
                        best = f"best (block_n, warps, per_sm)={res[0][1]}"
                if B == 1 and ctx == 32768:  # long context, one sequence: slices and programs
                    res = sorted((attn(min_split=ml, per_sm=ps), (ml, ps))
                                 for ml in (64, 128, 256) for ps in (2, 4, 8))
                    best += " (min_split, per_sm): " + ", ".join(
                        f"{c} {t * 1e3:.1f} us" for t, c in res[:4])
                if B == 1 and ctx <= 8192:   # short contexts: the slice length per program
                    best += " min_split: " + ", ".join(
                        f"{ml} {attn(min_split=ml) * 1e3:.1f} us" for ml in (32, 64, 128, 256))
                ms_ref = None
                if B == 1 or not quick:
                    ms_ref = bench_plain(lambda: registry.call_reference(
                        "paged_decode_attention", q, kc, vc, tables, sl, scale, gate=gate), rep=50)
                record("decode", f"{model} attn B={B} ctx={ctx}", nbytes, ms, ms_ref, best)
                if ctx == 1024 and B <= 8:
                    # as in a decode graph captured for max_model_len = 32k: the block table
                    # is 32k wide, the sequences hold 1k
                    wide = torch.zeros(B, 32768 // 16, dtype=torch.int32, device="cuda")
                    wide[:, :tables.shape[1]] = tables
                    record("decode", f"{model} attn B={B} ctx={ctx} in a 32k table", nbytes,
                           attn(wide))
                del kc, vc
        torch.cuda.empty_cache()


def _gdn_decode_inputs(B, m):
    hk, hv, d = m["lk"], m["lv"], 128
    q = torch.randn(B, hk, d, dtype=torch.float16, device="cuda")
    k = torch.randn(B, hk, d, dtype=torch.float16, device="cuda")
    v = torch.randn(B, hv, d, dtype=torch.float16, device="cuda")
    a = torch.randn(B, hv, dtype=torch.float16, device="cuda")
    b = torch.randn(B, hv, dtype=torch.float16, device="cuda")
    A_log = torch.randn(hv, device="cuda") * 0.5
    dt = torch.randn(hv, device="cuda") * 0.5
    st = torch.randn(max(B, 64), hv, d, d, device="cuda") * 0.05
    slots = torch.randperm(max(B, 64), device="cuda")[:B].to(torch.int32)
    return q, k, v, a, b, A_log, dt, st, slots


def _ring_bytes(B, C):
    """fp16 bytes of one conv1d decode step's state: K-1 = 3 ring columns read, 1 written,
    and the [C, 4] weights."""
    return B * C * 4 * 2 + C * 8


def bench_gdn(quick):
    models = ["9B"] if quick else ["0.8B", "9B", "27B"]
    for model in models:
        m = MODELS[model]
        for B in (1, 8, 32):
            q, k, v, a, b, A_log, dt, st, slots = _gdn_decode_inputs(B, m)
            nbytes = 2 * B * m["lv"] * 128 * 128 * 4 + (q.numel() + k.numel() + 2 * v.numel()) * 2
            ms = bench_graph(lambda: registry.call_triton(
                "gated_delta_rule_decode", q, k, v, a, b, A_log, dt, st, slots))
            ms_ref = bench_graph(lambda: registry.call_reference(
                "gated_delta_rule_decode", q, k, v, a, b, A_log, dt, st, slots))
            best = ""
            if model == "9B":
                res = []
                for bv, nw in ((8, 2), (16, 4), (32, 4), (64, 4), (16, 2), (32, 8), (64, 8), (8, 1)):
                    try:
                        t = bench_graph(lambda: registry.call_triton(
                            "gated_delta_rule_decode", q, k, v, a, b, A_log, dt, st, slots,
                            block_v=bv, num_warps=nw))
                        res.append((t, (bv, nw)))
                    except Exception as e:
                        print("   config", (bv, nw), "failed:", type(e).__name__)
                res.sort(key=lambda r: r[0])
                if res:
                    ms = min(ms, res[0][0])
                    best = f"best (block_v, warps)={res[0][1]}"
            record("gdn", f"{model} gdn-decode B={B}", nbytes, ms, ms_ref, best)
            # the engine's decode step: the conv1d step in the same kernel (raw projection in)
            C = 2 * m["lk"] * 128 + m["lv"] * 128
            qkv = torch.randn(B, C, dtype=torch.float16, device="cuda")
            w = torch.randn(C, 4, dtype=torch.float16, device="cuda")
            rings = torch.randn(st.shape[0], C, 4, dtype=torch.float16, device="cuda")
            lens = torch.randint(1, 4096, (B,), dtype=torch.int32, device="cuda")
            conv_bytes = _ring_bytes(B, C)        # q/k/v are in nbytes already
            args = (qkv, w, rings, lens, a, b, A_log, dt, st, slots)
            kw = dict(num_k_heads=m["lk"], head_k_dim=128)
            ms = bench_graph(lambda: registry.call_triton("conv_gated_delta_rule_decode", *args, **kw))
            ms_ref = bench_graph(lambda: registry.call_reference("conv_gated_delta_rule_decode", *args, **kw))
            record("gdn", f"{model} conv+gdn-decode B={B}", nbytes + conv_bytes, ms, ms_ref)
        # conv1d decode step alone on the same layer
        C = 2 * m["lk"] * 128 + m["lv"] * 128
        for B in (1, 32):
            x = torch.randn(B, C, dtype=torch.float16, device="cuda")
            w = torch.randn(C, 4, dtype=torch.float16, device="cuda")
            cst = torch.randn(64, C, 4, dtype=torch.float16, device="cuda")
            slots = torch.arange(B, dtype=torch.int32, device="cuda")
            lens = torch.randint(1, 4096, (B,), dtype=torch.int32, device="cuda")
            nbytes = B * C * 2 * 2 + _ring_bytes(B, C)           # x in, y out
            ms = bench_graph(lambda: registry.call_triton("causal_conv1d_decode", x, w, cst, slots, lens))
            ms_ref = bench_graph(lambda: registry.call_reference("causal_conv1d_decode", x, w, cst, slots, lens))
            record("conv", f"{model} conv1d-decode B={B} C={C}", nbytes, ms, ms_ref)
    # prefill (chunked) on the 9B layer: one 4k sequence and 4 x 1k
    m = MODELS["9B"]
    for lens in ([2048], [4096], [1024] * 4):
        T = sum(lens)
        hk, hv, d = m["lk"], m["lv"], 128
        q = torch.randn(T, hk, d, dtype=torch.float16, device="cuda")
        k = torch.randn(T, hk, d, dtype=torch.float16, device="cuda")
        v = torch.randn(T, hv, d, dtype=torch.float16, device="cuda")
        a = torch.randn(T, hv, dtype=torch.float16, device="cuda")
        b = torch.randn(T, hv, dtype=torch.float16, device="cuda")
        A_log = torch.randn(hv, device="cuda") * 0.5
        dt = torch.randn(hv, device="cuda") * 0.5
        st = torch.zeros(len(lens), hv, d, d, device="cuda")
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        slots = torch.arange(len(lens), dtype=torch.int32, device="cuda")
        init = torch.zeros(len(lens), dtype=torch.bool, device="cuda")
        args = (q, k, v, a, b, A_log, dt, cu, st, slots, init)
        ms = bench_plain(lambda: registry.call_triton("gated_delta_rule_prefill", *args), rep=200)
        ms_ref = bench_plain(lambda: registry.call_reference("gated_delta_rule_prefill", *args), rep=200)
        res = []
        # value columns and warps per phase-2 program (the default: 16 or 32 columns, 4 warps)
        # and software-pipelined loads (num_stages)
        for bv, nw, ns in ((16, 4, 1), (16, 2, 1), (32, 4, 1), (64, 8, 1), (16, 4, 2),
                           (32, 4, 2)):
            try:
                res.append((bench_plain(lambda: registry.call_triton(
                    "gated_delta_rule_prefill", *args, block_v=bv, num_warps=nw,
                    num_stages=ns), rep=100), (bv, nw, ns)))
            except Exception as e:
                print("   block_v, warps, stages", (bv, nw, ns), "failed:", type(e).__name__)
        res.sort(key=lambda r: r[0])
        best = (", (block_v, warps, stages): " + ", ".join(f"{c} {t:.3f} ms" for t, c in res)) if res else ""
        nbytes = (q.numel() + k.numel() + 2 * v.numel()) * 2 + 2 * st.numel() * 4
        record("gdn", f"9B gdn-prefill lens={lens[0]}x{len(lens)}", nbytes, ms, ms_ref,
               f"{T / (ms * 1e-3) / 1e3:.0f}k tok/s (ref {T / (ms_ref * 1e-3) / 1e3:.0f}k){best}")


def bench_prefill_attention(quick):
    m = MODELS["9B"]
    for lens in ([2048], [4096], [1024] * 4):
        T = sum(lens)
        bs = 16
        kc, vc, tables, sl = _paged(len(lens), max(lens), m["hk"], m["hd"], bs)
        q = torch.randn(T, m["hq"], m["hd"], dtype=torch.float16, device="cuda")
        gate = torch.randn_like(q)
        cu = torch.tensor([0] + torch.tensor(lens).cumsum(0).tolist(), dtype=torch.int32, device="cuda")
        args = (q, kc, vc, tables, cu, sl, m["hd"] ** -0.5)
        ms = bench_graph(lambda: registry.call_triton("prefill_attention", *args, gate=gate,
                                                      max_seqlen_q=max(lens)))
        ms_ref = bench_plain(lambda: registry.call_reference("prefill_attention", *args, gate=gate), rep=50)
        flops = sum(4 * n * n / 2 * m["hd"] * m["hq"] for n in lens)
        nbytes = 3 * q.numel() * 2 + 2 * T * m["hk"] * m["hd"] * 2
        record("prefill", f"9B attn lens={lens[0]}x{len(lens)}", nbytes, ms, ms_ref, flops=flops)


def bench_elementwise(quick):
    for H, T in ((4096, 1), (4096, 32), (5120, 4096)):
        x = torch.randn(T, H, dtype=torch.float16, device="cuda")
        r = torch.randn_like(x)
        w = torch.randn(H, dtype=torch.float16, device="cuda")
        nbytes = 4 * x.numel() * 2
        ms = bench_graph(lambda: registry.call_triton("rms_norm", x, w, 1e-6, residual=r))
        ms_ref = bench_graph(lambda: registry.call_reference("rms_norm", x, w, 1e-6, residual=r))
        record("norm", f"rms_norm+residual T={T} H={H}", nbytes, ms, ms_ref)
    for I, T in ((12288, 1), (12288, 32), (17408, 4096)):
        x = torch.randn(T, 2 * I, dtype=torch.float16, device="cuda")
        nbytes = 3 * T * I * 2
        ms = bench_graph(lambda: registry.call_triton("silu_and_mul", x))
        ms_ref = bench_graph(lambda: registry.call_reference("silu_and_mul", x))
        record("act", f"silu_and_mul T={T} I={I}", nbytes, ms, ms_ref)


GROUPS = {"gemv": bench_gemv, "qgemv": bench_qgemv, "linear-quant": bench_linear_quant,
          "decode": bench_decode_attention, "gdn": bench_gdn, "prefill": bench_prefill_attention,
          "elementwise": bench_elementwise}


def main():
    global COPY_BW
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", default=",".join(GROUPS), help="comma-separated: " + ",".join(GROUPS))
    ap.add_argument("--quick", action="store_true", help="9B shapes only, fewer sweeps")
    ap.add_argument("--json", default=None, help="write all rows to this JSON file")
    ap.add_argument("--types", default=None,
                    help="linear-quant: GGUF types (default Q8_0,Q4_K,Q6_K; also Q5_K, Q4_0)")
    ap.add_argument("--shapes", default=None,
                    help="linear-quant: OUTxIN weight shapes (default 4096x12288,12288x4096,"
                         "4096x4096; the engine fuses gate/up into 24576x4096)")
    ap.add_argument("--pdl", action="store_true",
                    help="capture with programmatic dependent launch, as the engine's decode "
                         "graphs do on sm_90 (g906/kernels/pdl.py)")
    args = ap.parse_args()
    if args.types:
        LINQ_TYPES[:] = [t.strip() for t in args.types.split(",") if t.strip()]
    if args.shapes:
        try:
            LINQ_SHAPES[:] = [tuple(int(v) for v in s.lower().split("x"))
                              for s in args.shapes.split(",") if s.strip()]
        except ValueError:
            sys.exit(f"--shapes: expected OUTxIN pairs such as 4096x12288, got {args.shapes!r}")
    if not torch.cuda.is_available():
        sys.exit("benchmarks/kernel_bench.py needs a GPU (CUDA or ROCm)")
    dev = torch.cuda.get_device_name()
    COPY_BW = copy_bandwidth()
    print(f"# {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC  {dev}  "
          f"torch {torch.__version__}  triton {triton.__version__}")
    print(f"# measured copy bandwidth (read+write): {COPY_BW:.0f} GB/s")
    from g906.kernels import pdl

    if args.pdl:
        with pdl.graph_launches():
            on = bool(pdl.pdl_args(torch.device("cuda", torch.cuda.current_device())))
        print(f"# programmatic dependent launch: {'on' if on else 'not available here'}")
    for g in args.only.split(","):
        try:
            with pdl.graph_launches() if args.pdl else contextlib.nullcontext():
                GROUPS[g](args.quick)
        except Exception as e:  # keep going: report the failure, measure the rest
            import traceback

            traceback.print_exc()
            print(f"!! group {g} failed: {type(e).__name__}: {e}", flush=True)
        torch.cuda.empty_cache()
    if args.json:
        with open(args.json, "w") as f:
            json.dump(dict(device=dev, copy_gbs=COPY_BW, rows=ROWS,
                           date=datetime.datetime.now(datetime.timezone.utc).isoformat()), f, indent=1)


if __name__ == "__main__":
    main()
