"""gfx9 code check: the kernels ROCm runs in decode, compiled for gfx908 as the engine launches
them, must not spill.

Upstream Triton 3.5 refuses gfx906 but compiles for gfx908 (MI100): the same wave64 GCN vector
ISA for this code, plus AGPRs (accumulation registers), which a gfx906 lacks. AGPRs in use,
spilled VGPRs or scratch memory in the gfx908 code are therefore spills on a gfx906, and a lane
has no more than 256 VGPRs there; the batch-1 packed GEMVs also promise <= 128 (two waves per
SIMD: g906/kernels/linear/packed_config.py, _pq_rocm_decode). The configs come from the launchers' own
config functions with the device mocked as ROCm (wave64), over every decode projection of the
real model shapes (g906/data/models.toml; the 35B-A3B's shared expert and router among them, its
routed experts' kernels in test_gfx9_moe.py), so the test follows the defaults when they change.
benchmarks/sass.py builds and compiles the GEMVs and the decode attention; the other decode
kernels are compiled from a recorded launch of their launcher on CPU tensors. No GPU: Triton's
bundled LLVM, about a second a kernel.

The compiling happens in a child process (this file run as a script) without TRITON_INTERPRET:
in the test session Triton's own library and the kernels are interpreted (tests/conftest.py).
"""

from __future__ import annotations

import importlib
import importlib.util
import inspect
import json
import os
import select
import subprocess
import sys
import tempfile
import traceback
from contextlib import ExitStack, contextmanager
from pathlib import Path
from unittest import mock

import pytest
import torch

from g906 import data

triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")

ROOT = Path(__file__).resolve().parents[2]
TARGET = "gfx908"
# every model shape; an MoE shape's (35B-A3B) MLP here is its shared expert (the dense MLP's
# kernels) and its router a plain GEMV: the routed experts' kernels are test_gfx9_moe.py's
SHAPES = data.load("models")["shapes"]


def _mlp_inter(s: dict) -> int:
    """The features of the MLP the dense kernels run: the shared expert's in an MoE shape."""
    return s.get("shared_expert_intermediate_size") or s["intermediate_size"]
QTYPES = ("Q4_K", "Q4_0", "Q5_K", "Q6_K", "Q8_0")
MAX_VGPRS = 256          # a gfx906 lane's
TWO_WAVES = 128          # two waves per SIMD
FIGURES = ("vgprs", "agprs", "spill_vgprs", "scratch_bytes", "loop_spills")   # sass.amd_registers
# The decode attention asks for two waves per SIMD (decode_launch_options: waves_per_eu = 2);
# LLVM then parks a few values that live across its loop (the epilogue's indices) in AGPRs,
# scratch on a gfx906: once a program, never in the loop, which the check below enforces.
ATTENTION_PARKED = 8
REQUEST_TIMEOUT_S = 300


def _sass():
    spec = importlib.util.spec_from_file_location("bench_sass", ROOT / "benchmarks" / "sass.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


# --- the compiling process -------------------------------------------------------------------------

def _probe(x_ptr):
    tl.store(x_ptr, 1.0)


def _handle(sass, req: dict) -> dict:
    """One request: {"probe": ...} (a trivial kernel), {"argv": sass.py's arguments} (its
    figures and constexprs) or {"kernel": "module:name", signature, constexprs, attrs, options}."""
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    target = GPUTarget("hip", TARGET, 64)
    if "probe" in req:
        ck = triton.compile(ASTSource(triton.jit(_probe), {"x_ptr": "*fp32"}), target=target)
        return sass.amd_registers(ck.asm["amdgcn"])
    if "argv" in req:
        args = sass.parser().parse_args(req["argv"])
        const = sass._kernel_and_signature(args)[2]
        figures = sass.analyse(args)
        return {**{k: figures[k] for k in FIGURES},
                "const": {k: v for k, v in const.items() if isinstance(v, (bool, int, float, str))}}
    module, name = req["kernel"].split(":")
    fn = getattr(importlib.import_module(module), name)
    attrs = {tuple(k): v for k, v in req["attrs"]}
    src = ASTSource(fn, req["signature"], req["constexprs"], attrs)
    if not req.get("fma_dot"):
        ck = triton.compile(src, target=target, options=req["options"])
        return sass.amd_registers(ck.asm["amdgcn"])
    # tl.dot as a gfx906 runs it: without the pass that turns it into gfx908's matrix-core
    # instructions (AGPR accumulators) it keeps the FMA lowering; compiled into a cache of its
    # own, so that no one else's gfx908 build reads this code
    from triton._C.libtriton import amd

    with tempfile.TemporaryDirectory() as cache, \
            mock.patch.object(amd.passes.ttgpuir, "add_accelerate_matmul", lambda *a: None), \
            mock.patch.object(triton.knobs.cache, "dir", cache):
        ck = triton.compile(src, target=target, options=req["options"])
        return sass.amd_registers(ck.asm["amdgcn"])


def _serve():
    """Answers one JSON request a line on stdin with one JSON line on the original stdout
    (everything else written to stdout goes to stderr)."""
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    sass = _sass()
    for line in sys.stdin:
        try:
            reply = {"result": _handle(sass, json.loads(line))}
        except Exception:   # noqa: BLE001 (sent back: the test shows it)
            reply = {"error": traceback.format_exc()}
        replies.write(json.dumps(reply) + "\n")
        replies.flush()


class _CompileError(RuntimeError):
    """The compiling process answered with an exception."""


class _Compiler:
    """The child process that compiles, and the requests to it."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
        self.log = tempfile.TemporaryFile(mode="w+")
        self.proc = subprocess.Popen([sys.executable, __file__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, stderr=self.log, text=True, env=env,
                                     cwd=ROOT)

    def __call__(self, req: dict) -> dict:
        self.proc.stdin.write(json.dumps(req) + "\n")
        self.proc.stdin.flush()
        ready, _, _ = select.select([self.proc.stdout], [], [], REQUEST_TIMEOUT_S)
        line = self.proc.stdout.readline() if ready else ""
        if not line:
            self.proc.kill()
            self.log.seek(0)
            raise RuntimeError(f"the compiling process gave no answer to {req} "
                               f"(exit status {self.proc.poll()}): {self.log.read()[-3000:]}")
        reply = json.loads(line)
        if "error" in reply:
            raise _CompileError(f"compiling {req} for {TARGET} failed:\n{reply['error']}")
        return reply["result"]

    def close(self):
        self.proc.stdin.close()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


@pytest.fixture(scope="session")
def compiler():
    """A _Compiler; a skip where this Triton has no AMD backend or cannot compile for gfx908."""
    if "amd" not in triton.backends.backends:
        pytest.skip(f"this Triton ({triton.__version__}) has no AMD backend")
    c = _Compiler()
    try:
        try:
            c({"probe": True})
        except _CompileError as e:
            last = str(e).strip().splitlines()[-1]
            pytest.skip(f"this Triton ({triton.__version__}) cannot compile for {TARGET}: {last}")
        yield c
    finally:
        c.close()


@pytest.fixture(scope="module")
def sass():
    return _sass()


# --- configs and checks ----------------------------------------------------------------------------

@contextmanager
def _rocm():
    """The launchers' config functions as on a ROCm device with 64-wide waves (CPU tensors)."""
    from g906.kernels.linear import dense, packed_config

    from tests.kernels.util import LINEAR_LAUNCHERS

    with ExitStack() as stack:
        for name in ("pdl", *(f"{n}.kernel" for n in ("attention", "norm", "rotary", "activation",
                                                       "gdn")), *(f"linear.{m}" for m in LINEAR_LAUNCHERS)):
            mod = importlib.import_module(f"g906.kernels.{name}")
            if hasattr(mod, "is_rocm"):
                stack.enter_context(mock.patch.object(mod, "is_rocm", lambda: True))
            if hasattr(mod, "warp_size"):
                stack.enter_context(mock.patch.object(mod, "warp_size", lambda device: 64))
        caches = [packed_config._pq_gemv_config_cached, dense._gemv_config_cached]   # keyed by device, not by ROCm
        stack.callback(lambda: [c.cache_clear() for c in caches])
        for c in caches:
            c.cache_clear()
        yield


def _problems(label: str, res: dict, max_vgprs: int = MAX_VGPRS, parked: int = 0) -> list[str]:
    """What in a compiled kernel's figures (sass.amd_registers) would spill on a gfx906; up to
    `parked` AGPRs are allowed where the main loop never touches them."""
    out = []
    if res["loop_spills"]:
        out.append(f"{label}: {res['loop_spills']} spill instructions (AGPR moves, scratch) in its main loop")
    if res["agprs"] > parked:
        out.append(f"{label}: {res['agprs']} AGPRs (spills on gfx906, which has none)"
                   + (f"; at most {parked} outside the loop allowed" if parked else ""))
    if res["spill_vgprs"]:
        out.append(f"{label}: {res['spill_vgprs']} VGPRs spilled")
    if res["scratch_bytes"]:
        out.append(f"{label}: {res['scratch_bytes']} scratch bytes (spills)")
    if res["vgprs"] > max_vgprs:
        why = " (not two waves per SIMD)" if max_vgprs == TWO_WAVES else ""
        out.append(f"{label}: {res['vgprs']} VGPRs > {max_vgprs}{why}")
    return out


def _check(results: list[tuple[str, dict, int]], parked: int = 0):
    for label, res, _ in results:   # shown with -s or on a failure
        print(f"{label}: {res['vgprs']} VGPRs, {res['agprs']} AGPRs, {res['spill_vgprs']} spilled, "
              f"{res['scratch_bytes']} scratch bytes, {res['loop_spills']} spill instructions in the loop")
    problems = [p for label, res, limit in results for p in _problems(label, res, limit, parked)]
    assert not problems, "\n".join(problems)


def _where(uses: list[str]) -> str:
    return ", ".join(uses[:3]) + (f" and {len(uses) - 3} more" if len(uses) > 3 else "")


def _gemvs(s: dict) -> list[tuple[str, int, int, str]]:
    """(projection, N, K, role) of a decode step's GEMVs, stacked as the engine fuses them
    (q|gate, k, v; the linear attention's qkv, z, b, a; gate|up). role: "in" takes the input
    norm (with dense weights split into its producer: RMS_IN), "out" writes the residual stream
    (ADD_NORM), "head" neither."""
    h, i, d = s["hidden_size"], _mlp_inter(s), s["head_dim"]
    hq, hk = s["num_attention_heads"], s["num_key_value_heads"]
    lk, dk = s["linear_num_key_heads"], s["linear_key_head_dim"]
    lv, dv = s["linear_num_value_heads"], s["linear_value_head_dim"]
    # an MoE shape's router and shared-expert gate: dense GEMVs (GGUF files keep them F32)
    router = [("router", s["num_experts"], h, "head"), ("shared_gate", 1, h, "head")] if s.get("num_experts") else []
    return [("qkv", 2 * hq * d + 2 * hk * d, h, "in"), ("o_proj", h, hq * d, "out"),
            ("in_proj", 2 * lk * dk + 2 * lv * dv + 2 * lv, h, "in"), ("out_proj", h, lv * dv, "out"),
            ("gate_up", 2 * i, h, "in"), ("down", h, i, "out"), ("lm_head", s["vocab_size"], h, "head"), *router]


DENSE_ONLY = ("router", "shared_gate")


def _analyse(compiler, argv) -> dict:
    """sass.py's figures (and constexprs) for its command line argv, compiled for gfx908."""
    return compiler({"argv": ["--target", TARGET, *map(str, argv)]})


# --- packed dequant-GEMVs (_pq_gemv_config: _pq_rocm_decode at T = 1, token blocks above) --------

PQ_FLAGS = {"WSPLIT": "--wsplit", "ONE_IMM": "--one-imm", "CVT": "--cvt", "PREFETCH": "--prefetch"}
TOKENS = {"T1": (1,), "T2": (2,), "T3-16": (3, 4, 8, 16)}


def _packed_argv(qtype: str, c: dict) -> tuple:
    """sass.py's arguments for a _pq_gemv_config. It compiles EVEN (no masked tail: the heavier
    loop; masked ones measured fewer VGPRs) and neither SILU nor TOKEN_BLOCKS. PRELOAD applies
    only under PDL, which ROCm never uses (test_packed_gemv checks)."""
    unknown = set(c) - {"BLOCK_N", "num_warps", "BLOCK_T", "PAIRS", "SPLIT", "PRELOAD", *PQ_FLAGS}
    assert not unknown, f"_pq_gemv_config's {sorted(unknown)}: not mapped to sass.py's flags here"
    return (("--qtype", qtype, "--rows", c["BLOCK_N"], "--warps", c["num_warps"],
             "--tokens", c["BLOCK_T"], "--pairs", c["PAIRS"])
            + tuple(flag for key, flag in PQ_FLAGS.items() if c[key]))


@pytest.mark.parametrize("tokens", list(TOKENS))
@pytest.mark.parametrize("qtype", QTYPES)
def test_packed_gemv(compiler, qtype, tokens):
    from g906.kernels import pdl
    from g906.kernels.linear import packed_config

    cases: dict[tuple, list[str]] = {}
    with _rocm():
        with pdl.graph_launches():
            assert pdl.pdl_args(torch.device("cuda")) == {}      # ROCm: no PDL (nor PRELOAD)
        for model, s in SHAPES.items():
            for proj, n, k, _ in _gemvs(s):
                if proj in DENSE_ONLY:
                    continue
                for T in TOKENS[tokens]:
                    c = packed_config._pq_gemv_config(T, n, k, qtype, torch.device("cpu"))
                    cases.setdefault(_packed_argv(qtype, c), []).append(f"{model} {proj} T={T}")
    results = []
    for argv, uses in cases.items():
        a = dict(zip(argv[::2], argv[1::2]))
        label = (f"{qtype} T={tokens[1:]} rows={a['--rows']} warps={a['--warps']} "
                 f"BLOCK_T={a['--tokens']} ({_where(uses)})")
        results.append((label, _analyse(compiler, argv), TWO_WAVES if tokens == "T1" else MAX_VGPRS))
    _check(results)


def test_the_check_catches_agprs(compiler):
    """A packed GEMV of 8 tokens a program (what ROCm ran before its token blocks of 4): the
    gfx908 code needs AGPRs, which the check reports."""
    res = _analyse(compiler, ["--qtype", "Q4_K", "--rows", 2, "--warps", 4, "--tokens", 8,
                              "--pairs", 2, "--wsplit", "--one-imm", "--cvt"])
    with pytest.raises(AssertionError, match=r"Q4_K T=8 rows=2: \d+ AGPRs \(spills on gfx906"):
        _check([("Q4_K T=8 rows=2", res, MAX_VGPRS)])
    # its AGPRs are used inside the loop: no allowance for values parked outside it excuses them
    with pytest.raises(AssertionError, match=r"Q4_K T=8 rows=2: \d+ spill instructions .* main loop"):
        _check([("Q4_K T=8 rows=2", res, MAX_VGPRS)], parked=res["agprs"])


# --- dense fp16 GEMV (_gemv_config at T = 1; the split RMSNorm around it in decode) ---------------

@pytest.mark.parametrize("norm", ["plain", "add_norm", "rms_in"])
def test_dense_gemv(compiler, norm):
    """The dense decode GEMVs as ROCm launches them at one token: a plain one (the first layer's
    inputs, the LM head), the output projections writing the next norm's partial sums (ADD_NORM)
    and the input projections reading them (RMS_IN, BLOCK_P = the producers' programs)."""
    from g906.kernels._triton_util import next_pow2
    from g906.kernels.linear import dense

    cases: dict[tuple, list[str]] = {}
    with _rocm():
        for model, s in SHAPES.items():
            cfg = {proj: (dense._gemv_config(1, n, k, torch.device("cuda"), torch.float16), role)
                   for proj, n, k, role in _gemvs(s)}
            # an input projection reads one partial sum per program of the output projection
            # before it: the most of them
            partials = max(-(-s["hidden_size"] // c["BLOCK_N"]) for c, role in cfg.values() if role == "out")
            for proj, (c, role) in cfg.items():
                assert not c["USE_DOT"] and c["BLOCK_T"] == 1, (model, proj, c)
                if (norm, role) in (("plain", "in"), ("plain", "head"), ("add_norm", "out")):
                    extra = ("--add-norm",) if norm == "add_norm" else ()
                elif (norm, role) == ("rms_in", "in"):
                    extra = ("--rms-in", "--partials", next_pow2(partials))
                else:
                    continue
                argv = ("--qtype", "F16", "--rows", c["BLOCK_N"], "--block-k", c["BLOCK_K"],
                        "--warps", c["num_warps"]) + extra
                cases.setdefault(argv, []).append(f"{model} {proj}")
    results = []
    for argv, uses in cases.items():
        a = dict(zip(argv[::2], argv[1::2]))
        label = (f"F16 {norm} rows={a['--rows']} BLOCK_K={a['--block-k']} warps={a['--warps']}"
                 + (f" partials={argv[-1]}" if norm == "rms_in" else "") + f" ({_where(uses)})")
        results.append((label, _analyse(compiler, argv), MAX_VGPRS))
    _check(results)


# --- paged decode attention (_decode_config: the broadcast path on ROCm) --------------------------

def _heads(s: dict) -> tuple[int, int]:
    return s["num_attention_heads"] // s["num_key_value_heads"], s["head_dim"]


HEADS = sorted({_heads(s) for s in SHAPES.values()})


@pytest.mark.parametrize("G, D", HEADS, ids=[f"G{g}-D{d}" for g, d in HEADS])
def test_decode_attention(compiler, G, D):
    """Built by sass.py's _attention_kernel_and_signature (with the launch options the launcher
    adds), at the tile _decode_config picks on ROCm."""
    from g906.kernels.attention import kernel as A

    warps = inspect.signature(A.paged_decode_attention).parameters["num_warps"].default
    hk = 2
    q = torch.zeros(1, G * hk, D, dtype=torch.float16)
    k_cache = torch.zeros(64, 16, hk, D, dtype=torch.float16)
    block_tables = torch.zeros(1, 64, dtype=torch.int32)
    with _rocm():
        g, block_g, block_n, _, use_dot = A._decode_config(q, k_cache, block_tables, hk, None)
    assert g == G and not use_dot
    res = _analyse(compiler, ["--qtype", "ATTN", "--heads-per-kv", G, "--head-dim", D, "--rows", block_n,
                              "--warps", warps])
    # sass.py builds the launch _decode_config makes
    const = res["const"]
    assert (const["BLOCK_G"], const["BLOCK_N"], const["USE_DOT"]) == (block_g, block_n, False), const
    models = [m for m, s in SHAPES.items() if _heads(s) == (G, D)]
    _check([(f"decode attention G={G} D={D} BLOCK_N={block_n} warps={warps} ({_where(models)})", res,
             MAX_VGPRS)], parked=ATTENTION_PARKED)


# --- the other decode kernels, from recorded launches ---------------------------------------------

class _Launches:
    """Stands in for a Triton kernel in its module: records fn[grid](*args, **kwargs)."""

    def __init__(self, fn):
        self.fn, self.calls = fn, []

    def __getitem__(self, grid):
        return lambda *args, **kwargs: self.calls.append((args, kwargs))


def _launch_request(sass, module: str, name: str, fn, args, kwargs) -> tuple[dict, dict]:
    """(compile request, constexprs) of one recorded launch, specialised as Triton specialises
    it on a device: tensors as pointers (16-byte aligned where they are), ints equal to 1 as
    constants and multiples of 16 as divisible by 16, floats as fp32; launch options kept."""
    from triton.runtime.jit import mangle_type

    params = inspect.signature(fn.fn).parameters      # (a JITFunction or an InterpretedFunction)
    names = list(params)
    bound = dict(zip(names, args)) | {k: v for k, v in kwargs.items() if k in params}
    options = {k: v for k, v in kwargs.items() if k not in params}
    ptrs, const, aligned, floats, unaligned = {}, {}, set(), set(), set()
    for p in params.values():
        v = bound.get(p.name, p.default)
        if "constexpr" in str(p.annotation):
            const[p.name] = v
        elif isinstance(v, torch.Tensor):
            ptrs[p.name] = mangle_type(v)
            if v.data_ptr() % 16:
                unaligned.add(p.name)
        elif isinstance(v, float):
            floats.add(p.name)
        elif isinstance(v, int) and not isinstance(v, bool):
            if v == 1:
                const[p.name] = 1
            elif v % 16 == 0:
                aligned.add(p.name)
        else:
            raise TypeError(f"{name}: argument {p.name} = {v!r} not handled here")
    _, sig, const, attrs = sass._signature(fn, ptrs, const, aligned, floats)
    attrs = [[list(i), a] for i, a in attrs.items() if names[i[0]] not in unaligned]
    return ({"kernel": f"{module}:{name}", "signature": sig, "constexprs": const, "attrs": attrs,
             "options": options}, const)


def _launches(s: dict, zero_centred: bool) -> dict:
    """{launcher: (kernel module in g906.kernels, kernel name, call)} of the decode kernels besides the GEMVs
    and the attention, one token at model shape s (the engine's dtypes and views; zeros, the
    values do not matter)."""
    f16, f32, i32, i64 = torch.float16, torch.float32, torch.int32, torch.int64
    z = lambda *shape, dtype=f16: torch.zeros(*shape, dtype=dtype)   # noqa: E731
    h, i, d = s["hidden_size"], _mlp_inter(s), s["head_dim"]
    hq, hk = s["num_attention_heads"], s["num_key_value_heads"]
    lk, dk = s["linear_num_key_heads"], s["linear_key_head_dim"]
    lv, dv = s["linear_num_value_heads"], s["linear_value_head_dim"]
    from g906.engine.weights import QuantizedTensor
    from g906.kernels.linear.gguf_decode import STEP_BYTES

    mods = {n: importlib.import_module(f"g906.kernels.{n}.kernel")
            for n in ("norm", "rotary", "gdn", "activation", "embedding")}
    rot = d // 4                                  # partial rotary: a quarter of the head
    # views of the fused projections' outputs, as the layers take them apart
    qkv_out = z(1, 2 * hq * d + 2 * hk * d)
    qg = qkv_out[:, :2 * hq * d].view(1, hq, 2 * d)
    k = qkv_out[:, 2 * hq * d:2 * hq * d + hk * d].view(1, hk, d)
    v = qkv_out[:, 2 * hq * d + hk * d:].view(1, hk, d)
    conv_dim = 2 * lk * dk + lv * dv
    qkv, zg, b, a = z(1, conv_dim + lv * dv + 2 * lv).split([conv_dim, lv * dv, lv, lv], dim=-1)

    def gdn(order, gated_norm=None):   # HF checkpoints: "grouped"; llama.cpp's GGUF: "tiled"
        return lambda: mods["gdn"].conv_gated_delta_rule_decode(
            qkv, z(conv_dim, 4), z(2, conv_dim, 4), z(1, dtype=i32), a, b, z(lv, dtype=f32),
            z(lv, dtype=f32), z(2, lv, dk, dv, dtype=f32), z(1, dtype=i32), num_k_heads=lk,
            head_k_dim=dk, v_head_order=order, gated_norm=gated_norm)

    def gdn_recurrent(order):          # a verify step's rows: 1 + k tokens a sequence
        from g906.kernels.gdn.recurrent import gated_delta_rule_recurrent

        x = z(4, conv_dim)
        return lambda: gated_delta_rule_recurrent(
            x[:, :lk * dk].view(4, lk, dk), x[:, lk * dk:2 * lk * dk].view(4, lk, dk), x[:, 2 * lk * dk:].view(4, lv, dv),
            z(4, lv), z(4, lv), z(lv, dtype=f32), z(lv, dtype=f32), torch.tensor([0, 4], dtype=i32),
            z(2, lv, dk, dv, dtype=f32), z(1, dtype=i32), torch.ones(1, dtype=torch.bool), v_head_order=order)

    return {
        "gdn_recurrent grouped": ("gdn.recurrent", "_gdn_recurrent_kernel", gdn_recurrent("grouped")),
        "gdn_recurrent tiled": ("gdn.recurrent", "_gdn_recurrent_kernel", gdn_recurrent("tiled")),
        "rms_norm": ("norm.kernel", "_rms_norm_kernel", lambda: mods["norm"].rms_norm(
            z(1, h), z(h), 1e-6, residual=z(1, h), zero_centred=zero_centred)),
        "qk_norm_rotary": ("rotary.kernel", "_qk_norm_rotary_kernel", lambda: mods["rotary"].qk_norm_rotary(
            qg[..., :d], k, z(d), z(d), 1e-6, z(1, dtype=i64), z(4096, rot, dtype=f32), rot,
            zero_centred=zero_centred, kv_store=(v, z(64, 16, hk, d), z(64, 16, hk, d), z(1, dtype=i64)))),
        "gdn_decode grouped": ("gdn.kernel", "_gdn_decode_kernel", gdn("grouped")),
        "gdn_decode tiled": ("gdn.kernel", "_gdn_decode_kernel", gdn("tiled")),
        # before a quantized out_proj: the gated norm by the head's last program (arrival count)
        "gdn_decode gated_norm": ("gdn.kernel", "_gdn_decode_kernel",
                                  gdn("tiled", (zg.view(1, lv, dv), z(dv), 1e-6))),
        # prefill's (and silu_and_mul where the GEMV after it does not take it in)
        "gated_rms_norm": ("norm.kernel", "_gated_rms_norm_kernel", lambda: mods["norm"].gated_rms_norm(
            z(1, lv, dv), zg.view(1, lv, dv), z(dv), 1e-6)),
        "silu_and_mul": ("activation.kernel", "_silu_and_mul_kernel", lambda: mods["activation"].silu_and_mul(
            z(1, 2 * i))),
        # a GGUF token embedding (a few rows stand for the vocabulary: only the row stride counts)
        **{f"embedding {q}": ("embedding.kernel", "_embedding_kernel", lambda q=q: mods["embedding"].embedding(
            QuantizedTensor(z(8, h // 256 * STEP_BYTES[q], dtype=torch.uint8), q, (8, h)),
            z(1, dtype=i64), f16)) for q in ("Q8_0", "Q4_K", "Q5_K", "Q6_K")},
    }


def _fused_gemvs(s: dict, zero_centred: bool) -> dict:
    """{launcher: (kernel module, kernel name, calls)} of the GEMVs that apply a prologue on
    load, where the launcher fuses it (its own test: programs x K x T <= FUSED_RECOMPUTE_MAX;
    calls that would not launch the GEMV are left out): the MLP's down projection on [gate | up]
    (dense weights at one token with the next norm's ADD_NORM; packed: SILU, T <= 16) and, dense,
    the linear attention's out_proj of its gated RMSNorm; and the packed gate/up projection
    with its SwiGLU epilogue (GLU). Weights uninitialised (never read)."""
    from g906.kernels.linear import kernel as K
    from g906.kernels.linear import repack

    f16 = torch.float16
    h, i = s["hidden_size"], _mlp_inter(s)
    lv, dv = s["linear_num_value_heads"], s["linear_value_head_dim"]
    add_norm = (torch.zeros(1, h, dtype=f16), torch.zeros(h, dtype=f16), zero_centred)
    out = {}
    x = torch.zeros(1, 2 * i, dtype=f16)
    w = torch.empty(h, i, dtype=f16)
    out["silu_mul_linear F16"] = ("linear.dense", "_gemv_kernel", [
        lambda x=x, w=w: K.silu_mul_linear(x, w, add_norm=add_norm)] if K._gemv_fusable(x, w) else [])
    o = torch.zeros(1, lv, dv, dtype=f16)
    zg = torch.zeros(1, 2 * lv * dv, dtype=f16)[:, lv * dv:].view(1, lv, dv)   # a view, as the layer's
    w = torch.empty(h, lv * dv, dtype=f16)
    out["gated_norm_linear F16"] = ("linear.dense", "_gemv_kernel", [
        lambda w=w: K.gated_norm_linear(o, zg, torch.zeros(dv, dtype=f16), 1e-6, w, add_norm=add_norm)]
        if K._gemv_fusable(o.reshape(1, lv * dv), w) else [])
    for qtype in QTYPES:
        be, bb = repack.BLOCKS[qtype]
        row = repack.pack(torch.zeros(1, i // be * bb, dtype=torch.uint8), qtype, (1, i))
        pw = repack.PackedQuant(qtype, (h, i), {k: torch.empty((h, *v.shape[1:]), dtype=v.dtype)
                                                 for k, v in row.planes.items()})
        xs = [torch.zeros(T, 2 * i, dtype=f16) for T in (1, 2, 3, 4, 8, 16)]
        out[f"silu_mul_linear {qtype}"] = ("linear.packed", "_pq_gemv_kernel", [
            lambda x=x, pw=pw: K.silu_mul_linear(x, pw) for x in xs if K._packed_silu_pays(x, pw)])
        # the stacked gate/up projection with the SwiGLU in its epilogue (GLU)
        row = repack.pack(torch.zeros(1, h // be * bb, dtype=torch.uint8), qtype, (1, h))
        gu = repack.PackedQuant(qtype, (2 * i, h), {k: torch.empty((2 * i, *v.shape[1:]), dtype=v.dtype)
                                                    for k, v in row.planes.items()})
        out[f"linear_glu {qtype}"] = ("linear.packed", "_pq_gemv_kernel", [
            lambda x=x, gu=gu: K.linear_glu(x, gu) for x in (torch.zeros(T, h, dtype=f16) for T in (1, 4))])
    return out


LAUNCHERS = ("rms_norm", "qk_norm_rotary", "gdn_decode grouped", "gdn_decode tiled",
             "gdn_decode gated_norm", "gdn_recurrent grouped", "gdn_recurrent tiled", "gated_rms_norm",
             "silu_and_mul", "silu_mul_linear F16", "gated_norm_linear F16",
             *(f"embedding {q}" for q in ("Q8_0", "Q4_K", "Q5_K", "Q6_K")),
             *(f"silu_mul_linear {q}" for q in QTYPES), *(f"linear_glu {q}" for q in QTYPES))
_FUSED = {n for n in LAUNCHERS if n.startswith(("silu_mul_linear", "gated_norm_linear", "linear_glu"))}


@pytest.mark.parametrize("launcher", LAUNCHERS)
def test_decode_kernels(compiler, sass, launcher):
    """The other decode kernels (norms, rotary, the GDN step, silu-mul) and the GEMVs with a
    prologue, compiled from their launchers' recorded launches at every model shape."""
    cases: dict[str, tuple] = {}
    with _rocm():
        for model, s in SHAPES.items():
            for zc in (False, True):     # GGUF norms / HF's zero-centred ones
                if launcher in _FUSED:
                    short, name, calls = _fused_gemvs(s, zc)[launcher]
                else:
                    short, name, call = _launches(s, zc)[launcher]
                    calls = [call]
                module = f"g906.kernels.{short}"
                mod = importlib.import_module(module)
                rec = _Launches(getattr(mod, name))
                with mock.patch.object(mod, name, rec):
                    for call in calls:
                        call()
                assert len(rec.calls) == len(calls), f"{launcher}: {len(rec.calls)} launches of {name}"
                for args, kwargs in rec.calls:
                    req, const = _launch_request(sass, module, name, rec.fn, args, kwargs)
                    case = cases.setdefault(json.dumps(req, sort_keys=True), (req, const, set()))
                    case[2].add(model)
    if not cases:
        pytest.skip(f"{launcher}: no model shape launches it with today's defaults")
    results = []
    for req, const, models in cases.values():
        shown = " ".join(f"{k}={v}" for k, v in const.items() if k.isupper())
        label = f"{launcher} {shown} warps={req['options'].get('num_warps')} ({_where(sorted(models))})"
        results.append((label, compiler(req), MAX_VGPRS))
    _check(results)



if __name__ == "__main__":
    _serve()
