"""benchmarks/sass.py: the GEMVs compiled for sm_90 offline (Triton's own ptxas and nvdisasm),
registers and instruction mix read back."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _run(*args) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sass.py"), "--json", *args],
                         capture_output=True, text=True, env=env, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout)


def test_packed_gemv_mix_shows_the_field_pairing():
    paired = _run("--qtype", "Q4_K", "--rows", "2", "--warps", "1")
    single = _run("--qtype", "Q4_K", "--rows", "2", "--warps", "1", "--no-pairs")
    for res in (paired, single):
        assert res["kernel"] == "_pq_gemv_kernel" and 0 < res["registers"] <= 255
        assert res["spill_bytes"] == 0 and res["mix"]["FFMA"] > 0 and res["mix"]["LDG"] > 0
        assert res["instructions"] == sum(res["mix"].values())
    # fields decoded two per shift: fewer shifts than one field at a time (docs/PERF.md run 5)
    assert paired["mix"]["SHF"] < single["mix"]["SHF"]
    # the streaming loop found in the SASS: its loads and FMAs, and per weight fewer
    # instructions paired (2 rows x 32 weights a thread and iteration)
    for res in (paired, single):
        loop = res["loop_mix"]
        assert 0 < res["loop_instructions"] == sum(loop.values()) < res["instructions"]
        assert loop["LDG"] > 0 and loop["FFMA"] >= 64
        assert res["loop_per_weight"] == round(res["loop_instructions"] / 64, 2)
    assert paired["loop_per_weight"] < single["loop_per_weight"]


def test_dense_gemv_split_norm_variants():
    """The consumer loads the producer's partial sums; the producer stores h, hn and them."""
    base = ("--qtype", "F16", "--rows", "4", "--block-k", "128")
    plain = _run(*base)
    consumer = _run(*base, "--rms-in", "--partials", "64")
    producer = _run(*base, "--add-norm")
    assert consumer["mix"]["LDG"] > plain["mix"]["LDG"]
    assert producer["mix"]["STG"] > plain["mix"]["STG"] and producer["mix"]["LDG"] > plain["mix"]["LDG"]


def test_gfx908_code_of_the_packed_gemv():
    """AMD wave64 code (the nearest target to gfx906): with 1.0f as an immediate the field's mask
    and exponent are one v_and_or_b32, about one VALU instruction less per weight."""
    base = ("--target", "gfx908", "--qtype", "Q4_0", "--rows", "2", "--warps", "1")
    reg = _run(*base)
    imm = _run(*base, "--one-imm")
    for res in (reg, imm):
        assert 0 < res["vgprs"] <= 256 and res["scratch_bytes"] == 0 and res["mix"]["v_fma_mix_f32"] > 0
        assert res["loop_valu"] == sum(res["mix"].values()) <= res["loop_instructions"]
    assert "v_and_or_b32" not in reg["mix"] and imm["mix"]["v_and_or_b32"] > 0
    assert imm["valu_per_weight"] <= reg["valu_per_weight"] - 0.9


def test_gfx908_code_of_the_decode_attention():
    """The broadcast path ROCm runs (no tl.dot): two waves per SIMD, nothing spilled in its
    loop (a few values that live across it parked in AGPRs: decode_launch_options), its loop
    reduces across lanes."""
    res = _run("--target", "gfx908", "--qtype", "ATTN", "--rows", "8", "--warps", "4")
    assert 0 < res["vgprs"] <= 128 and res["agprs"] <= 8 and res["scratch_bytes"] == 0
    assert res["loop_spills"] == 0
    assert res["loop_lds"] > 0 and res["mix"]["v_exp_f32_e32"] > 0
    assert _run("--qtype", "ATTN", "--rows", "32", "--warps", "8")["mix"]["HMMA"] > 0   # sm_90: tl.dot


def test_q4k_fields_in_packed_fp16():
    """Q4_K with fp16 activations (PAIRS = 3): the products are packed HFMA2s on one register
    per two rows' fields (no byte permutes gathering them: docs/PERF.md E23), fewer loop
    instructions a weight than the fp32 fields (3.2 against 3.8 at 8 rows)."""
    base = ("--qtype", "Q4_K", "--rows", "8", "--warps", "2")
    fp32, fp16 = _run(*base), _run(*base, "--pairs", "3")
    assert fp16["spill_bytes"] == 0
    assert fp16["loop_mix"]["HFMA2"] >= 2 * 128            # 256 weights a thread: products + centring
    assert fp16["loop_mix"].get("PRMT", 0) <= 16 and fp16["loop_mix"].get("FFMA", 0) <= 32
    assert fp16["loop_per_weight"] <= fp32["loop_per_weight"] - 0.4


def test_packed_gemv_rows_addressed_by_immediates():
    """With the planes' row strides compile-time constants and whole row blocks, every row's
    load is the program's base plus an immediate: no per-row address arithmetic (IMAD.WIDE) in
    the loop, one load per row and plane (docs/PERF.md E27: 813 -> 771 instructions). The
    gate/up GEMV (SwiGLU epilogue) runs under _launch_regs' cap of 96 without spilling."""
    import torch

    from g906.kernels.linear.packed_config import _launch_regs

    res = _run("--qtype", "Q4_K", "--rows", "8", "--warps", "4", "--pairs", "3", "--pdl",
               "--k", "12288")
    assert "IMAD" not in res["loop_mix"] and res["loop_mix"]["LDG"] == 32   # 8 rows x 3 planes + 8 x
    assert res["loop_per_weight"] <= 3.05
    cap = _launch_regs(torch.device("cuda"), 0, True, 2, 3, True)["maxnreg"]
    glu = _run("--qtype", "Q4_K", "--rows", "8", "--warps", "2", "--pairs", "3", "--pdl", "--glu",
               "--rms-in", "--maxnreg", str(cap))
    assert glu["registers"] <= cap and glu["spill_bytes"] == 0


def test_q4k_row_pairs_drop_the_regrouping():
    """Q4_K stored as row pairs (g906/kernels/linear/repack.py): the packed-fp16 loop takes the
    pairs as loaded, without the 64 instructions that regroup each pair of rows' words (sm_90
    at 8 rows: 767 -> 703, docs/PERF.md E28), at no more registers."""
    base = ("--qtype", "Q4_K", "--rows", "8", "--warps", "4", "--pairs", "3", "--pdl", "--k", "12288")
    rows, pairs = _run(*base, "--row-pairs", "0"), _run(*base, "--row-pairs", "1")
    assert pairs["loop_instructions"] <= rows["loop_instructions"] - 56
    assert pairs["loop_per_weight"] <= 2.8 and pairs["registers"] <= rows["registers"]
    assert pairs["spill_bytes"] == 0


def test_q4k_prefetch_fits_four_programs_an_sm():
    """The 9B's Q4_K down projection (4096 x 12288: 512 programs of 4 warps, 3 iterations each)
    prefetches its next iteration's planes (docs/PERF.md E29). Two iterations' words then live
    at once; it must stay within 128 registers without spilling, alone and with the split
    norm's epilogue under its cap, so that four programs fit an SM and the grid one wave."""
    base = ("--qtype", "Q4_K", "--rows", "8", "--warps", "4", "--pairs", "3", "--pdl",
            "--prefetch", "--k", "12288")
    for extra in ((), ("--add-norm", "--maxnreg", "128")):
        res = _run(*base, *extra)
        assert res["registers"] <= 128 and res["spill_bytes"] == 0, extra


def test_q5k_fields_in_packed_fp16():
    """Q5_K with fp16 activations (PAIRS = 3): the 5-bit bytes of two rows in one register, an
    HFMA2 a product, fewer loop instructions a weight than its fp32 fields at the same rows
    (4.4 against 5.1 at 8; docs/PERF.md E24)."""
    base = ("--qtype", "Q5_K", "--rows", "8", "--warps", "2")
    fp32, fp16 = _run(*base, "--wsplit"), _run(*base, "--pairs", "3")
    assert fp16["spill_bytes"] == 0
    assert fp16["loop_mix"]["HFMA2"] >= 2 * 128            # 256 weights a thread: products + centring
    assert fp16["loop_mix"].get("PRMT", 0) <= 16 and fp16["loop_mix"].get("FFMA", 0) <= 32
    assert fp16["loop_per_weight"] <= fp32["loop_per_weight"] - 0.4


def test_q6k_fields_in_packed_fp16():
    """Q6_K with fp16 activations (PAIRS = 3) at 8 rows: its sums stay in the activations'
    layout (the kernel's 0 * x4 anchor: without it every product went through shared memory),
    and the loop takes fewer instructions a weight than the 4-row fp32 fields it replaces
    (4.44 against 5.85; docs/PERF.md E25). Ending with the split norm it runs under the
    128-register cap only where that does not spill (_launch_regs: the PRELOAD build)."""
    import torch

    from g906.kernels.linear.packed_config import _launch_regs

    fp32 = _run("--qtype", "Q6_K", "--rows", "4", "--warps", "1", "--wsplit")
    cuda = torch.device("cuda")
    for extra in ((), ("--add-norm",), ("--add-norm", "--pdl")):
        cap = _launch_regs(cuda, "--add-norm" in extra, False, 4, 3, "--pdl" in extra).get("maxnreg")
        assert cap == (128 if extra == ("--add-norm", "--pdl") else None)
        more = ("--maxnreg", str(cap)) if cap else ()
        fp16 = _run("--qtype", "Q6_K", "--rows", "8", "--warps", "4", "--pairs", "3", *extra, *more)
        assert fp16["spill_bytes"] == 0, extra
        assert not {"LDS", "STS", "BAR", "STSM", "LDSM"} & set(fp16["loop_mix"])
        assert fp16["loop_mix"]["HFMA2"] >= 2 * 128        # 256 weights a thread: products + centring
        assert fp16["loop_per_weight"] <= fp32["loop_per_weight"] - 1.0
