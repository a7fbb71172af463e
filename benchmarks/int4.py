"""Int4 (GPTQ / AWQ / compressed-tensors) dequant-GEMV at Qwen3.5-9B shapes, as % of the
device's copy rate, beside the GGUF Q4_K kernel on the same shapes.

    python benchmarks/int4.py                    # GPU: the Triton kernels (CUDA graphs)
    python benchmarks/int4.py --json out.json
    python benchmarks/int4.py --reference --shrink 16 --quick    # CPU: the torch references

For each projection of a 9B layer (and the LM head) it builds a random int4 weight (group 128,
symmetric and with zero points) and a random Q4_K weight of the same shape, then times
linear(x, w) for one token (decode) and a 512-token prefill. A row prints the time (median),
the bytes the product must move at least (packed weight + scales + activations), the rate in
GB/s and its % of the measured copy rate (read + write of a large buffer); prefill rows also
print TFLOP/s. --reference times the PyTorch references instead (on the CPU: the figures only
prove the script and the references work, they say nothing about the kernels). --shrink N
divides every dimension by N (quick runs).

--moe adds the routed experts of Qwen3.5-35B-A3B (256 experts of 512 features, hidden 2048,
top-8): ops.moe_experts over int4 g128 experts (GroupQuantExperts, as GPTQ-Int4 / AWQ load)
beside Q4_K experts, one token (the routed GEMV) and a 512-token prefill (the grouped GEMM).
The bytes counted are the active ones: the chosen experts' weights (every expert some token
picked), not all 256.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

import torch

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

from g906.engine.weights import QuantizedTensor  # noqa: E402
from g906.kernels import ops, registry  # noqa: E402
from g906.engine.weights import QuantizedExperts  # noqa: E402
from g906.kernels.int4.experts import GroupQuantExperts  # noqa: E402
from g906.kernels.int4.reference import pack_rows  # noqa: E402
from g906.kernels.int4.weight import GroupQuantWeight  # noqa: E402

# Qwen3.5-9B (HF config): hidden 4096, intermediate 12288, 16 q heads / 4 kv heads of 256,
# linear attention 16 key heads / 32 value heads of 128, vocabulary 248320
SHAPES_9B = {          # name: (N, K)
    "linear_attn.in_proj_qkv": (2 * 16 * 128 + 32 * 128, 4096),
    "linear_attn.in_proj_z": (32 * 128, 4096),
    "linear_attn.out_proj": (4096, 32 * 128),
    "self_attn.q_proj": (16 * 256 * 2, 4096),
    "self_attn.k_proj": (4 * 256, 4096),
    "self_attn.o_proj": (4096, 16 * 256),
    "mlp.gate_up_proj": (2 * 12288, 4096),
    "mlp.down_proj": (4096, 12288),
    "lm_head": (248320, 4096),
}
QUICK = ("linear_attn.in_proj_qkv", "mlp.down_proj")


def int4_weight(N, K, *, zeros: bool, device, group=128, seed=0) -> GroupQuantWeight:
    g = torch.Generator().manual_seed(seed)
    G = -(-K // group)
    q = torch.randint(0, 16, (N, K), generator=g, dtype=torch.int32)
    s = (torch.rand(N, G, generator=g) * 0.01 + 0.001).half()
    z = torch.randint(0, 16, (N, G), generator=g).to(torch.uint8) if zeros else None
    return GroupQuantWeight(pack_rows(q, 4), s, z, 4, group, (N, K)).to(device)


def q4k_weight(N, K, device, seed=0) -> QuantizedTensor:
    """Random Q4_K blocks (144 bytes / 256 values) with small finite fp16 scales."""
    g = torch.Generator().manual_seed(seed)
    nb = N * K // 256
    raw = torch.randint(0, 256, (nb, 144), generator=g, dtype=torch.uint8)
    d = (torch.rand(nb, 2, generator=g) * 0.003).half().view(torch.uint8).reshape(nb, 4)
    raw[:, :4] = d
    return QuantizedTensor(raw.reshape(N, K // 256 * 144).to(device), "Q4_K", (N, K))


def _sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def time_ms(fn, device, rep: int) -> float:
    """Median ms: CUDA-graph replay on a GPU (launch gaps do not count), wall clock on the CPU."""
    fn()
    _sync(device)
    if device.type == "cuda":
        import triton.testing

        try:
            return triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median")
        except Exception:
            return triton.testing.do_bench(fn, warmup=10, rep=rep, return_mode="median")
    times = []
    for _ in range(max(1, rep // 20)):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def copy_rate(device) -> float:
    """GB/s of a large copy (bytes read + written)."""
    n = (1 << 30 if device.type == "cuda" else 1 << 24) // 2
    a = torch.randn(n, dtype=torch.float16, device=device)
    b = torch.empty_like(a)
    ms = time_ms(lambda: b.copy_(a), device, rep=100)
    return 2 * a.numel() * 2 / (ms * 1e-3) / 1e9


def run(*, device: torch.device, reference: bool, quick: bool, shrink: int, rep: int = 100) -> dict:
    if reference:
        os.environ["G906_KERNELS"] = "reference"
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    bw = copy_rate(device)
    rows = []
    names = QUICK if quick else tuple(SHAPES_9B)
    for name in names:
        N, K = (max(256, d // shrink) // 256 * 256 for d in SHAPES_9B[name])
        kinds = {
            "int4 g128 sym": int4_weight(N, K, zeros=False, device=device),
            "int4 g128 zp": int4_weight(N, K, zeros=True, device=device),
            "Q4_K": ops.prepare_linear_weight(q4k_weight(N, K, device)),
        }
        for T in (1, 512 // shrink if shrink > 1 else 512):
            x = (torch.randn(T, K) * 0.1).to(device, dtype)
            for kind, w in kinds.items():
                ms = time_ms(lambda: ops.linear(x, w), device, rep)
                nbytes = w.nbytes + x.numel() * x.element_size() + T * N * x.element_size()
                gbs = nbytes / (ms * 1e-3) / 1e9
                path = registry.choose("linear", x, w)
                row = dict(shape=name, N=N, K=K, T=T, weight=kind, path=path, ms=ms, bytes=nbytes,
                           gbs=gbs, pct_copy=100 * gbs / bw, tflops=2 * T * N * K / (ms * 1e-3) / 1e12)
                rows.append(row)
                extra = f"  {row['tflops']:.2f} TFLOP/s" if T > 1 else ""
                print(f"{name:<26} {N:>6}x{K:<5} T={T:<4} {kind:<14} {path:<9} {ms:9.4f} ms "
                      f"{gbs:8.1f} GB/s {row['pct_copy']:6.1f}% of copy{extra}", flush=True)
    return dict(device=str(device), reference=reference, copy_gbs=bw, shrink=shrink, rows=rows)


MOE_35B = dict(experts=256, top_k=8, hidden=2048, inter=512)


def int4_experts(E, N, K, *, device, group=128, seed=0) -> GroupQuantExperts:
    g = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (E * N, K), generator=g, dtype=torch.int32)
    s = (torch.rand(E, N, -(-K // group), generator=g) * 0.01 + 0.001).half()
    return GroupQuantExperts(pack_rows(q, 4).reshape(E, N, K // 8), s, None, 4, group, (E, N, K)).to(device)


def q4k_experts(E, N, K, device, seed=0) -> QuantizedExperts:
    t = q4k_weight(E * N, K, "cpu", seed)
    return QuantizedExperts(t.data.reshape(E, N, -1).to(device), "Q4_K", (E, N, K))


def run_moe(*, device: torch.device, reference: bool, shrink: int, rep: int, bw: float) -> list[dict]:
    if reference:
        os.environ["G906_KERNELS"] = "reference"
    dtype = torch.float16 if device.type == "cuda" else torch.float32
    E, k = MOE_35B["experts"] // shrink, MOE_35B["top_k"]
    H, inter = (max(256, MOE_35B[d] // shrink) for d in ("hidden", "inter"))
    kinds = {"int4 g128 sym": (int4_experts(E, 2 * inter, H, device=device),
                               int4_experts(E, H, inter, device=device, seed=1)),
             "Q4_K": (q4k_experts(E, 2 * inter, H, device), q4k_experts(E, H, inter, device, seed=1))}
    rows = []
    g = torch.Generator().manual_seed(2)
    for T in (1, 512 // shrink if shrink > 1 else 512):
        x = (torch.randn(T, H, generator=g) * 0.1).to(device, dtype)
        w, ids = ops.moe_route(torch.randn(T, E, generator=g).to(device), k, True)
        active = int(torch.unique(ids).numel())
        for kind, (gu, dn) in kinds.items():
            ms = time_ms(lambda: ops.moe_experts(x, gu, dn, ids, w), device, rep)
            nbytes = (gu.nbytes + dn.nbytes) * active // E + 2 * x.numel() * x.element_size()
            gbs = nbytes / (ms * 1e-3) / 1e9
            path = registry.choose("moe_experts", x, gu, dn, ids, w)
            row = dict(shape="moe.experts (35B-A3B)", N=2 * inter, K=H, T=T, weight=kind, path=path, ms=ms,
                       bytes=nbytes, gbs=gbs, pct_copy=100 * gbs / bw, active_experts=active,
                       tflops=2 * T * k * 3 * inter * H / (ms * 1e-3) / 1e12)
            rows.append(row)
            print(f"{'moe.experts':<26} {E:>3}x{active:>3} act T={T:<4} {kind:<14} {path:<9} {ms:9.4f} ms "
                  f"{gbs:8.1f} GB/s {row['pct_copy']:6.1f}% of copy", flush=True)
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--reference", action="store_true", help="time the PyTorch references (CPU: the only choice)")
    ap.add_argument("--quick", action="store_true", help="two shapes only")
    ap.add_argument("--shrink", type=int, default=1, help="divide every dimension by this")
    ap.add_argument("--rep", type=int, default=100)
    ap.add_argument("--moe", action="store_true", help="also the routed experts of Qwen3.5-35B-A3B (int4 vs Q4_K)")
    ap.add_argument("--json", help="write the rows here")
    args = ap.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    reference = args.reference or device.type == "cpu"
    if device.type == "cpu" and not args.reference:
        print("# no GPU: timing the PyTorch references (--reference)")
    out = run(device=device, reference=reference, quick=args.quick, shrink=max(1, args.shrink), rep=args.rep)
    if args.moe:
        out["rows"] += run_moe(device=device, reference=reference, shrink=max(1, args.shrink), rep=args.rep,
                               bw=out["copy_gbs"])
    print(f"# copy rate (read + write): {out['copy_gbs']:.0f} GB/s on {out['device']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
