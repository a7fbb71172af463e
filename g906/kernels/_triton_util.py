"""Shared helpers for the Triton launchers (imported only on the Triton path)."""

from __future__ import annotations

import functools
import weakref

import torch

# prefill with quantized weights on a GPU (GGUF, int4): weights dequantized at a time for the
# vendor GEMM (256 MB fp16): every 9B/27B matrix but the LM head (never a prefill GEMM) in one
# block; row blocks are multiples of DEQUANT_ROWS
DEQUANT_CHUNK = 1 << 27
DEQUANT_ROWS = 256


def dequant_matmul(x: torch.Tensor, N: int, K: int, dense_rows, out: torch.Tensor) -> torch.Tensor:
    """out [T, N] = x [T, K] @ W^T for a quantized W [N, K], dequantized a row block at a time
    (dense_rows(r0, r1): its rows r0:r1 dense, in x's dtype) for the vendor GEMM (cuBLAS /
    rocBLAS): far faster than a tiled dequant-GEMM in Triton, and the dense block is transient.
    Several blocks are written transposed, so that each lands contiguously."""
    step = max(DEQUANT_ROWS, (DEQUANT_CHUNK // max(K, 1)) // DEQUANT_ROWS * DEQUANT_ROWS)
    if N <= step:
        w = dense_rows(0, N)
        if out.dtype == x.dtype:
            return torch.mm(x, w.t(), out=out)
        out.copy_(torch.mm(x, w.t()))
        return out
    out_t = torch.empty((N, x.shape[0]), dtype=x.dtype, device=x.device)
    for r0 in range(0, N, step):
        r1 = min(N, r0 + step)
        torch.mm(dense_rows(r0, r1), x.t(), out=out_t[r0:r1])
    out.copy_(out_t.t())
    return out


def next_pow2(n: int) -> int:
    return 1 << (max(int(n), 1) - 1).bit_length()


@functools.lru_cache(maxsize=None)
def _num_sms(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def num_sms(device: torch.device) -> int:
    if device.type != "cuda":
        return 16  # interpreter: any small number
    return _num_sms(device.index if device.index is not None else torch.cuda.current_device())


def is_rocm() -> bool:
    return torch.version.hip is not None


def row_warps(block: int) -> int:
    """num_warps for a one-row-per-program kernel. Valid for 32- and 64-wide waves."""
    if block >= 8192:
        return 8
    if block >= 2048:
        return 4
    if block >= 512:
        return 2
    return 1


def poison() -> bool:
    """G906_KERNELS_POISON=1: outputs start as NaN (tests), so unwritten elements show."""
    import os

    return os.environ.get("G906_KERNELS_POISON", "0") == "1"


def empty(shape, dtype, device):
    t = torch.empty(shape, dtype=dtype, device=device)
    if poison() and t.is_floating_point():
        t.fill_(float("nan"))
    return t


def empty_like(x):
    return empty(x.shape, x.dtype, x.device)


_COUNTERS: dict = {}
_OLD_COUNTERS: list = []


def arrival_counters(device: torch.device, n: int) -> torch.Tensor:
    """At least n int32 counters on `device`, shared by the kernels whose programs count
    their arrivals (the last to arrive finishes the work): each call of such a kernel advances
    its counters by a multiple of 64 and tests the low six bits, so they need no reset
    between calls. A larger set replaces a smaller one; the old stays allocated, since CUDA
    graphs captured with it keep its address."""
    key = str(device)
    have = _COUNTERS.get(key)
    if have is None or have.numel() < n:
        if have is not None:
            _OLD_COUNTERS.append(have)
        have = torch.zeros(max(n, 4096), dtype=torch.int32, device=device)
        _COUNTERS[key] = have
    return have


_STEP_MEMO: dict = {}


def step_memo(tag: str, tensors: tuple, extra, make):
    """make()'s value, reused while the same tensor objects (unmodified) and `extra` come back:
    every layer of a forward step passes the step's metadata tensors (cu_seqlens, ...), so the
    bookkeeping derived from them is computed once per step, not once per layer (each costs
    several launches). Held by weak references: a new step's tensors are new objects."""
    hit = _STEP_MEMO.get(tag)
    if (hit is not None and hit[2] == extra and len(hit[0]) == len(tensors)
            and all(r() is t and v == _version(t) for r, v, t in zip(hit[0], hit[1], tensors))):
        return hit[3]
    value = make()
    _STEP_MEMO[tag] = (tuple(weakref.ref(t) for t in tensors), tuple(_version(t) for t in tensors),
                       extra, value)
    return value


def _version(t: torch.Tensor):
    """The in-place version counter; inference-mode tensors keep none (identity alone decides)."""
    return None if t.is_inference() else t._version


def _fix_interpreter_scalar_index() -> None:
    """Triton 3.5's interpreter turns scalars into 1-element arrays and converts them to loop
    bounds with int(array), which NumPy >= 2.4 refuses for 1-d arrays. Index through the single
    element instead (interpreter only; compiled kernels are unaffected)."""
    try:
        from triton.runtime import interpreter as _interp
    except Exception:
        return
    orig = getattr(_interp, "_patch_lang_tensor", None)
    if orig is None or getattr(orig, "_g906", False):
        return

    def patched(tensor):
        orig(tensor)
        tensor.__index__ = lambda self: int(self.handle.data.reshape(-1)[0])

    patched._g906 = True
    _interp._patch_lang_tensor = patched


_fix_interpreter_scalar_index()
