"""Compile a decode GEMV for sm_90 or gfx908 without a GPU; print its registers and instruction mix.

    python benchmarks/sass.py --qtype Q4_K --rows 8 --warps 4          # packed dequant-GEMV
    python benchmarks/sass.py --qtype F16 --rows 8 --block-k 512       # dense fp16 GEMV
    python benchmarks/sass.py --qtype Q8_0 --rows 4 --prefetch --json  # machine-readable
    python benchmarks/sass.py --qtype F16 --rows 16 --block-k 256 --rms-in --partials 256
    python benchmarks/sass.py --target gfx908 --moe gate_up --qtype Q4_K --rows 16   # MoE routed GEMV

Triton's own ptxas and nvdisasm (shipped in its wheel) turn the kernel into SASS, so this
runs on any machine: it is how the instruction counts in docs/PERF.md were read (a kernel at
~50% of the copy rate that issues ~4 instructions per weight is bound by issue, not memory).
It also prints the main loop's instructions per weight per thread (the longest backward
branch that loads; an H200 issues ~7.9 thread-instructions a byte at its copy rate).
The pointers and strides are declared 16-byte aligned, as the engine's tensors are.

    python benchmarks/sass.py --target gfx908 --qtype Q4_K --rows 8 --wsplit --one-imm

--target gfx908 compiles for AMD's wave64 GCN ISA instead (Triton's bundled LLVM and lld):
the nearest target to gfx906 that upstream Triton 3.5 accepts ("unsupported target" for
gfx906 itself). Their VALU instruction sets match for this code (gfx908 adds matrix cores and
AGPRs, which a gfx906 lacks: AGPRs in use would be spills there). It prints VGPRs, AGPRs and
the main loop's vector instructions per weight per lane (a gfx906 issues about 6.6e12 of them
a second against 1 TB/s). The packed GEMVs get H = 64 threads per warp.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))

# arguments the engine always passes 16-byte aligned / divisible by 16
ALIGNED = {"sq", "sh", "sa", "sb", "KW", "kw_len", "K", "sw_n", "sx_t", "so_t", "P_in", "sx", "so"}
PLANE_TYPES = {"Q8_0": ("*fp16", "*fp16"), "Q4_0": ("*fp16", "*fp16"), "Q4_K": ("*i32", "*i16"),
               "Q5_K": ("*i32", "*i16"), "Q6_K": ("*i8", "*fp16")}


def _lanes(args) -> int:
    return 64 if args.target.startswith("gfx") else 32


def _kernel_and_signature(args):
    from g906.kernels.linear import dense, packed_fields, packed_gemv

    # the split RMSNorm's operands (g906/kernels/linear/residual_norm.py)
    norm_ptrs = {"r_ptr": "*fp16", "hn_ptr": "*fp16", "anw_ptr": "*fp16", "ss_out_ptr": "*fp32",
                 "ss_in_ptr": "*fp32"}
    norm = dict(ADD_NORM=2 if args.add_norm else 0, RMS_IN=args.rms_in, BLOCK_P=args.partials)
    if args.qtype == "ATTN":
        return _attention_kernel_and_signature(args)
    if args.moe:
        return _moe_kernel_and_signature(args)
    if args.qtype == "F16":
        fn = dense._gemv_kernel
        ptrs = {"x_ptr": "*fp16", "w_ptr": "*fp16", "out_ptr": "*fp16", "z_ptr": "*fp16",
                "nw_ptr": "*fp16", **norm_ptrs}
        const = dict(BLOCK_N=args.rows, BLOCK_K=args.block_k, BLOCK_T=1, USE_DOT=False,
                     EVEN_K=True, PRO=0, G=1, PDL=args.pdl, **norm)
    else:
        fn = packed_gemv._pq_gemv_kernel
        a_t, b_t = PLANE_TYPES[args.qtype]
        ptrs = {"x_ptr": "*fp16", "qs_ptr": "*i32", "qh_ptr": "*i32", "out_ptr": "*fp16",
                "a_ptr": a_t, "b_ptr": b_t, **norm_ptrs}
        const = dict(QT=packed_fields.PQ_QTYPES[args.qtype], E=packed_fields.PQ_E[args.qtype], H=_lanes(args) * args.warps,
                     BLOCK_N=args.rows, BLOCK_T=args.tokens, EVEN=True, PREFETCH=args.prefetch,
                     PAIRS=(0 if args.no_pairs else args.pairs if args.pairs is not None
                            else 2 if args.qtype == "Q4_K" else 1),
                     SILU=False, PDL=args.pdl, WSPLIT=args.wsplit, ONE_IMM=args.one_imm, CVT=args.cvt,
                     TOKEN_BLOCKS=False, GLU=args.glu,
                     PRELOAD=_preload(args), EVEN_N=True, ROWPAIRED=_row_pairs(args), **norm,
                     **_plane_strides(args))
    return _signature(fn, ptrs, const, ALIGNED, {"eps", "eps_in"})


def _plane_strides(args) -> dict:
    """The packed planes' row strides for rows of --k elements (compile-time constants of the
    kernel), read off a one-row weight packed as the engine packs it."""
    import torch

    from g906.kernels.linear import packed_config, repack
    from g906.kernels.linear.gguf_blocks import BLOCKS

    be, bb = BLOCKS[args.qtype]
    raw = torch.zeros(1, args.k // be * bb, dtype=torch.uint8)
    planes = packed_config._pq_args(repack.pack(raw, args.qtype, (1, args.k)))
    return {name: p.stride(0) for name, p in zip(("sq", "sh", "sa", "sb"), planes)}


def _row_pairs(args) -> bool:
    """ROWPAIRED: --row-pairs, else as the engine packs the weight on the target (Q4_K off
    ROCm: g906/kernels/linear/repack.py)."""
    from g906.kernels.linear import repack

    if args.row_pairs is not None:
        return bool(args.row_pairs)
    return repack.pairs_rows(args.qtype, args.rows, rocm=args.target.startswith("gfx"))


def _preload(args) -> int:
    """The packed GEMV's PRELOAD: --preload, else what the engine's PDL graphs run."""
    from g906.kernels.linear import packed_config

    if not args.pdl or args.prefetch:
        return 0
    return args.preload if args.preload is not None else int(packed_config.pq_preloads(args.qtype, args.rows))


def _signature(fn, ptrs, const, aligned, floats):
    """(fn, signature, constexprs, attrs) for triton.compile: pointers as given, constexprs,
    the float arguments, i32 for the rest; pointers and `aligned` divisible by 16."""
    names = list(fn.arg_names)
    sig = {a: ptrs.get(a, "constexpr" if a in const else ("fp32" if a in floats else "i32"))
           for a in names}
    attrs = {(i,): [["tt.divisibility", 16]] for i, a in enumerate(names)
             if a in ptrs or a in aligned}
    return fn, sig, {k: v for k, v in const.items() if k in names}, attrs


def _attention_kernel_and_signature(args):
    """The paged decode attention kernel (g906/kernels/attention), one KV head's G query heads over
    --rows (BLOCK_N) cache positions a tile; tl.dot on sm_90, the broadcast path on AMD (as
    _decode_config picks them)."""
    from g906.kernels._triton_util import next_pow2
    from g906.kernels.attention import kernel as A

    fn = A._decode_kernel
    ptrs = {"q_ptr": "*fp16", "kc_ptr": "*fp16", "vc_ptr": "*fp16", "bt_ptr": "*i32", "sl_ptr": "*i32",
            "gate_ptr": "*fp16", "out_ptr": "*fp16", "po_ptr": "*fp32", "pl_ptr": "*fp32"}
    G, D = args.heads_per_kv, args.head_dim
    dot = args.target == "sm_90"
    const = dict(G=G, BLOCK_G=max(16, next_pow2(G)) if dot else next_pow2(G), D=D, BLOCK_D=next_pow2(D),
                 BLOCK_N=args.rows, DIRECT=False, HAS_GATE=True, USE_DOT=dot, FP32=False, PDL=args.pdl)
    # the cache, q, gate and output strides are multiples of 16; the block table's is not
    aligned = {"sq_b", "sq_h", "sk_blk", "sk_off", "sk_h", "sv_blk", "sv_off", "sv_h", "sg_b", "sg_h",
               "so_b", "so_h", "block_size"}
    return _signature(fn, ptrs, const, aligned, {"qk_scale"})


def _moe_kernel_and_signature(args):
    """The MoE routed GEMV of decode (g906/kernels/moe): the gate/up kernel (--moe gate_up: one
    (token, expert) pair's gate and up rows, SwiGLU) or the down kernel (--moe down: a token's
    top-k experts in turn), --rows rows a program over rows of --k elements, top-8; dense fp16
    experts (F16, --block-k a step) or GGUF blocks (256 values a step), as moe_experts launches."""
    from g906.kernels.linear.gguf_decode import QTYPES, STEP_BYTES
    from g906.kernels.moe import kernel as M

    dense = args.qtype == "F16"
    w = "*fp16" if dense else "*u8"
    const = dict(TOPK=8, QT=-1 if dense else QTYPES[args.qtype], STEP_B=1 if dense else STEP_BYTES[args.qtype],
                 BLOCK_N=args.rows, BLOCK_K=args.block_k)
    if args.moe == "gate_up":
        fn = M._routed_gate_up_kernel
        ptrs = {"x_ptr": "*fp16", "w_ptr": w, "ids_ptr": "*i32", "h_ptr": "*fp16"}
    else:
        fn = M._routed_down_kernel
        ptrs = {"h_ptr": "*fp16", "w_ptr": w, "ids_ptr": "*i32", "tw_ptr": "*fp32", "y_ptr": "*fp16"}
    return _signature(fn, ptrs, const, {"I", "N", "K", "sx", "swe", "swn", "sh", "sy"}, set())


def _weights_per_lane(args) -> int:
    """Weights one lane decodes per iteration of the main loop (packed: 4 words a row;
    attention: K and V elements of the tile; MoE: a step of every row)."""
    from g906.kernels.linear.packed_fields import PQ_E

    if args.moe:
        return max(1, args.rows * (args.block_k if args.qtype == "F16" else 256) // (_lanes(args) * args.warps))
    if args.qtype == "ATTN":
        return max(1, args.rows * args.head_dim * 2 // (_lanes(args) * args.warps))
    if args.qtype == "F16":
        return args.rows * args.block_k // (_lanes(args) * args.warps)
    return args.rows * 4 * PQ_E[args.qtype]


def _main_loop(asm: str) -> list[str]:
    """The instructions of the longest backward branch's body that loads from global memory
    (AMDGPU assembly): LLVM may place an epilogue's blocks out of order, so a branch back in
    the text is not always a loop; the streaming loop is the one with the loads."""
    lines = asm.splitlines()
    labels, best = {}, []
    for i, line in enumerate(lines):
        m = re.match(r"^(\.LBB\d+_\d+):", line)
        if m:
            labels[m.group(1)] = i
        m = re.match(r"\s+s_(?:cbranch_\w+|branch)\s+(\.LBB\d+_\d+)", line)
        if m and labels.get(m.group(1), i) < i:
            body = [x.split()[0] for x in lines[labels[m.group(1)]:i] if re.match(r"\s+[a-z]+_[a-z0-9_]+", x)]
            loads = any(op.startswith(("global_load", "buffer_load")) for op in body)
            best = body if loads and len(body) > len(best) else best
    return best


# an instruction line of nvdisasm -c: its address, a predicate, the opcode (suffixes after ".")
SASS_OP = re.compile(r"/\*[0-9a-f]{4,}\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_]+)")


def sass_main_loop(sass: str) -> list[str]:
    """The opcodes of the longest backward branch's body that loads from global memory (sm_90
    SASS from nvdisasm -c): a GEMV's streaming loop; a peeled first iteration (PRELOAD) and the
    epilogue are outside it."""
    labels, insts, best = {}, [], []
    pending = []
    for line in sass.splitlines():
        m = re.match(r"^(\.L_x_\d+):", line.strip())
        if m:
            pending.append(m.group(1))
            continue
        m = SASS_OP.search(line)
        if not m:
            continue
        for lab in pending:
            labels[lab] = len(insts)
        pending = []
        insts.append(m.group(1))
        b = re.search(r"\bBRA\s+`?\(?(\.L_x_\d+)", line)
        if b and labels.get(b.group(1), len(insts)) < len(insts) - 1:
            body = insts[labels[b.group(1)]:]
            if "LDG" in body and len(body) > len(best):
                best = body
    return best


def amd_registers(asm: str) -> dict:
    """VGPRs, AGPRs, spilled VGPRs and scratch bytes that a kernel's AMDGPU assembly declares,
    and its main loop's spill instructions (AGPR moves, scratch accesses): values parked
    outside the loop cost once a program, inside it every iteration
    (tests/kernels/test_gfx9_code.py reads them for kernels this script does not build)."""

    def meta(key):
        m = re.search(re.escape(key) + r":\s+(\d+)", asm)
        return int(m.group(1)) if m else 0

    loop_spills = sum(1 for op in _main_loop(asm) if op.startswith(("v_accvgpr", "scratch_")))
    return {"vgprs": meta(".vgpr_count"), "agprs": meta(".agpr_count"),
            "spill_vgprs": meta(".vgpr_spill_count"), "scratch_bytes": meta(".private_segment_fixed_size"),
            "loop_spills": loop_spills}


def analyse_amd(args, src, const) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget

    options = {"num_warps": args.warps}
    if args.qtype == "ATTN":   # as paged_decode_attention launches it
        from g906.kernels.attention import kernel as A

        options.update(A.decode_launch_options(False, True, const["BLOCK_G"], const["BLOCK_N"],
                                               const["BLOCK_D"], args.warps))
    ck = triton.compile(src, target=GPUTarget("hip", args.target, 64), options=options)
    asm = ck.asm["amdgcn"]
    loop = _main_loop(asm)
    valu = [op for op in loop if op.startswith("v_")]
    mix = collections.Counter(valu)
    return {"target": args.target, "qtype": args.qtype, "rows": args.rows, "warps": args.warps,
            **amd_registers(asm), "loop_instructions": len(loop), "loop_valu": len(valu),
            "loop_lds": sum(1 for op in loop if op.startswith("ds_")),
            "valu_per_weight": round(len(valu) / _weights_per_lane(args), 2) if valu else None,
            "mix": dict(mix.most_common())}


def analyse(args) -> dict:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    fn, sig, const, attrs = _kernel_and_signature(args)
    src = ASTSource(fn=fn, signature=sig, constexprs=const, attrs=attrs)
    if args.target != "sm_90":
        return analyse_amd(args, src, const)
    options = {"num_warps": args.warps}
    if args.maxnreg:
        options["maxnreg"] = args.maxnreg
    ck = triton.compile(src, target=GPUTarget("cuda", 90, 32), options=options)
    bindir = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin")
    with tempfile.TemporaryDirectory() as d:
        cubin, ptx = os.path.join(d, "k.cubin"), os.path.join(d, "k.ptx")
        with open(cubin, "wb") as f:
            f.write(ck.asm["cubin"])
        with open(ptx, "w") as f:
            f.write(ck.asm["ptx"])
        sass = subprocess.run([os.path.join(bindir, "nvdisasm"), "-c", cubin],
                              capture_output=True, text=True, check=True).stdout
        cap = [f"--maxrregcount={args.maxnreg}"] if args.maxnreg else []
        info = subprocess.run([os.path.join(bindir, "ptxas"), "-v", "--gpu-name=sm_90a", *cap, ptx,
                               "-o", os.devnull], capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", info)
    spills = re.search(r"(\d+) bytes spill stores", info)
    ops = collections.Counter()
    for line in sass.splitlines():
        m = SASS_OP.search(line)
        if m:
            ops[m.group(1)] += 1
    loop = sass_main_loop(sass)
    return {"kernel": fn.__name__, "qtype": args.qtype, "rows": args.rows, "warps": args.warps,
            "registers": int(regs.group(1)) if regs else None,
            "spill_bytes": int(spills.group(1)) if spills else 0,
            "shared_bytes": ck.metadata.shared,
            "instructions": sum(ops.values()), "mix": dict(ops.most_common()),
            "loop_instructions": len(loop),
            "loop_per_weight": round(len(loop) / _weights_per_lane(args), 2) if loop else None,
            "loop_mix": dict(collections.Counter(loop).most_common())}


def parser() -> argparse.ArgumentParser:
    """The command line (tests build their arguments with it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="sm_90", choices=["sm_90", "gfx908", "gfx90a"],
                    help="sm_90 (SASS) or an AMD wave64 target (gfx908: the nearest to gfx906)")
    ap.add_argument("--qtype", default="Q4_K", choices=["F16", "ATTN", *PLANE_TYPES],
                    help="a GEMV's weights, or ATTN: the paged decode attention (per K/V element)")
    ap.add_argument("--heads-per-kv", type=int, default=4, help="ATTN: query heads per KV head (G)")
    ap.add_argument("--head-dim", type=int, default=256, help="ATTN: head dim")
    ap.add_argument("--rows", type=int, default=8, help="BLOCK_N")
    ap.add_argument("--warps", type=int, default=4)
    ap.add_argument("--k", type=int, default=4096, help="packed: the row length K")
    ap.add_argument("--block-k", type=int, default=512, help="F16 only")
    ap.add_argument("--prefetch", action="store_true", help="packed: PREFETCH")
    ap.add_argument("--wsplit", action="store_true",
                    help="packed: the words of a vector as separate tensors (Q5_K/Q6_K default)")
    ap.add_argument("--no-pairs", action="store_true", help="packed 4-bit: fields one at a time")
    ap.add_argument("--tokens", type=int, default=1, help="packed: BLOCK_T, tokens per program (decode batch)")
    ap.add_argument("--cvt", action="store_true",
                    help="packed Q8_0/Q5_K/Q6_K: fields converted from their bytes (CVT)")
    ap.add_argument("--pairs", type=int, choices=[0, 1, 2, 3], default=None,
                    help="packed: PAIRS (default 2 for Q4_K, else 1; 3: Q4_K / Q5_K / Q6_K in packed fp16)")
    ap.add_argument("--pdl", action="store_true", help="compile the PDL variant")
    ap.add_argument("--maxnreg", type=int, default=None,
                    help="sm_90: a register cap (the engine's 128 for GEMVs ending with the norm)")
    ap.add_argument("--preload", type=int, choices=(0, 1), default=None,
                    help="packed, with --pdl: the first iteration loaded before the PDL wait "
                         "(PRELOAD; default the engine's choice, pq_preloads)")
    ap.add_argument("--row-pairs", type=int, choices=(0, 1), default=None,
                    help="packed Q4_K: words stored as row pairs (ROWPAIRED; default as the "
                         "engine packs them: on for sm_90, off for AMD)")
    ap.add_argument("--one-imm", action="store_true",
                    help="packed: 1.0f's bits as an immediate (ONE_IMM, the ROCm default)")
    ap.add_argument("--glu", action="store_true",
                    help="packed: the gate/up GEMV with silu(gate) * up in its epilogue (GLU)")
    ap.add_argument("--add-norm", action="store_true",
                    help="with the residual add and norm weight at the end (producer)")
    ap.add_argument("--rms-in", action="store_true",
                    help="scaling by 1 / rms of its input's residual (consumer)")
    ap.add_argument("--partials", type=int, default=1024,
                    help="with --rms-in: the producer's programs (partial sums; a power of 2)")
    ap.add_argument("--moe", choices=["gate_up", "down"], default=None,
                    help="the MoE routed GEMV (g906/kernels/moe) instead: --qtype F16 or a GGUF type, "
                         "--rows its BLOCK_N (engine: 16), --block-k F16's step (engine: 128)")
    ap.add_argument("--json", action="store_true")
    return ap


def main() -> int:
    args = parser().parse_args()
    os.environ.pop("TRITON_INTERPRET", None)
    res = analyse(args)
    if args.json:
        print(json.dumps(res))
        return 0
    if "vgprs" in res:
        print(f"{args.target} {res['qtype']} rows={res['rows']} warps={res['warps']}: {res['vgprs']} VGPRs, "
              f"{res['agprs']} AGPRs, {res['scratch_bytes']} scratch bytes; main loop {res['loop_valu']} VALU "
              f"of {res['loop_instructions']} ({res['loop_lds']} LDS), {res['valu_per_weight']} per "
              f"{'K/V element' if args.qtype == 'ATTN' else 'weight'} per lane")
        print("  " + ", ".join(f"{k} {v}" for k, v in list(res["mix"].items())[:12]))
        return 0
    print(f"{res['kernel']} {res['qtype']} rows={res['rows']} warps={res['warps']}: "
          f"{res['registers']} registers, {res['spill_bytes']} bytes spilled, "
          f"{res['shared_bytes']} bytes shared, {res['instructions']} instructions")
    print("  " + ", ".join(f"{k} {v}" for k, v in list(res["mix"].items())[:16]))
    if res["loop_instructions"]:
        print(f"  main loop: {res['loop_instructions']} instructions, {res['loop_per_weight']} per "
              f"{'K/V element' if args.qtype == 'ATTN' else 'weight'} per thread: "
              + ", ".join(f"{k} {v}" for k, v in list(res["loop_mix"].items())[:12]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
