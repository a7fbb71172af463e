"""GPTQ, AWQ and compressed-tensors checkpoints: each quantized module's tensors (qweight /
qzeros / scales / g_idx, or weight_packed / weight_scale / weight_zero_point / weight_shape /
weight_g_idx) gathered and converted to one GroupQuantWeight named "<module>.weight".

The formats' layouts are described in g906/arch/hf_quant.py (which also decides, from
quantization_config, each module's bits, groups and zero-point convention). A module is
quantized when its packed tensor is in the files; one the config leaves in 16 bit
(modules_to_not_convert, `dynamic` "-:" rules, `ignore`) comes as a plain ".weight". An
act-order module (g_idx not k // group_size) has its input features reordered here, once,
so that every group is contiguous; the weight remembers the permutation for the activations."""

from __future__ import annotations

from typing import Iterable, Iterator

import torch

from g906.arch.hf_quant import HFQuant, LayerQuant
from g906.errors import G906Error
from g906.kernels.int4.reference import pack_rows, unpack_rows
from g906.kernels.int4.weight import GroupQuantWeight

_FP16_MAX = 65504.0
_AWQ_UNDO = (0, 4, 1, 5, 2, 6, 3, 7)      # natural column m of a word sits in slot _AWQ_UNDO[m]

PARTS = {
    "gptq": ("qweight", "qzeros", "scales", "g_idx", "bias"),
    "awq": ("qweight", "qzeros", "scales", "bias"),
    "compressed-tensors": ("weight_packed", "weight_scale", "weight_zero_point", "weight_shape",
                           "weight_g_idx", "bias"),
}
_PACKED = {"gptq": "qweight", "awq": "qweight", "compressed-tensors": "weight_packed"}
_REQUIRED = {"gptq": ("qweight", "scales"), "awq": ("qweight", "scales"),
             "compressed-tensors": ("weight_packed", "weight_scale")}


def _split(name: str) -> tuple[str, str]:
    module, _, part = name.rpartition(".")
    return module, part


class QuantAssembler:
    """Feed it every (name, tensor) of the checkpoint; it passes plain tensors through and
    yields each quantized module's GroupQuantWeight once all its tensors have been read.

    names: every tensor name in the files (so it knows which parts each module has)."""

    def __init__(self, hq: HFQuant, names: Iterable[str], where: str):
        self.hq = hq
        self.where = where
        parts = PARTS[hq.method]
        packed = _PACKED[hq.method]
        names = list(names)
        quantized = {_split(n)[0] for n in names if _split(n)[1] == packed}
        self.expected: dict[str, set[str]] = {m: set() for m in quantized}
        for n in names:
            m, p = _split(n)
            if m in self.expected and p in parts:
                self.expected[m].add(p)
        self.pending: dict[str, dict[str, torch.Tensor]] = {}

    def feed(self, name: str, t: torch.Tensor) -> Iterator[tuple[str, object]]:
        module, part = _split(name)
        if module not in self.expected or part not in self.expected[module]:
            yield name, t
            return
        got = self.pending.setdefault(module, {})
        got[part] = t
        if set(got) == self.expected[module]:
            del self.pending[module]
            yield module + ".weight", self.convert(module, got)

    def finish(self) -> None:
        if self.pending:
            m, got = next(iter(self.pending.items()))
            missing = sorted(self.expected[m] - set(got))
            raise G906Error(f"{self.where}: quantized module {m} lacks {', '.join(missing)}",
                            hint="the download is incomplete or the index is stale")

    # ------------------------------------------------------------------ conversion

    def convert(self, module: str, parts: dict[str, torch.Tensor]) -> GroupQuantWeight:
        scheme = self.hq.scheme_for(module)
        if scheme is None:
            raise G906Error(
                f"{self.where}: module {module} is stored quantized, but quantization_config leaves it "
                "unquantized (modules_to_not_convert / dynamic / ignore)",
                hint="the checkpoint and its config.json disagree; re-download or fix config.json")
        missing = [p for p in _REQUIRED[self.hq.method] if p not in parts]
        if missing:
            raise G906Error(f"{self.where}: quantized module {module} lacks {', '.join(missing)}",
                            hint="the download is incomplete or the checkpoint is damaged")
        bias = parts.pop("bias", None)
        if bias is not None and bool(bias.ne(0).any()):
            raise G906Error(f"{self.where}: {module}.bias is not zero, but this model's projections have no bias")
        try:
            if self.hq.method == "gptq":
                return _from_gptq(parts, scheme)
            if self.hq.method == "awq":
                return _from_awq(parts, scheme)
            return _from_compressed_tensors(parts, scheme)
        except _Bad as exc:
            raise G906Error(f"{self.where}: quantized module {module} ({self.hq.method}, {scheme.describe()}): {exc}",
                            hint="the tensors do not match quantization_config (a damaged or mislabelled checkpoint?)") from None


class _Bad(Exception):
    pass


def _need(cond: bool, msg: str) -> None:
    if not cond:
        raise _Bad(msg)


def _int32(t: torch.Tensor, what: str) -> torch.Tensor:
    _need(t.dtype == torch.int32 and t.dim() == 2, f"{what} is {t.dtype} {list(t.shape)}, not a 2-D int32 tensor")
    return t


def _scales(s: torch.Tensor, N: int, G: int, what: str) -> torch.Tensor:
    """[N, G] float16 (checked for fp16 range)."""
    _need(s.is_floating_point() and tuple(s.shape) == (N, G), f"{what} has shape {list(s.shape)}, expected {[N, G]}")
    if s.dtype != torch.float16:
        big = float(s.float().abs().max()) if s.numel() else 0.0
        _need(big <= _FP16_MAX, f"{what} holds scales up to {big:.4g}, beyond float16's range")
        s = s.to(torch.float16)
    return s.contiguous()


def _group_size(scheme: LayerQuant, K: int) -> int:
    return K if scheme.group_size == -1 else scheme.group_size


def _groups(K: int, gs: int) -> int:
    return -(-K // gs)


def _act_order(q: torch.Tensor, g_idx: torch.Tensor | None, K: int, gs: int, G: int):
    """(q with its columns in group order, perm or None). A g_idx equal to k // gs (static groups,
    or no act order) needs nothing."""
    if g_idx is None:
        return q, None
    g = g_idx.to(torch.long).reshape(-1)
    _need(g.numel() == K, f"g_idx has {g.numel()} entries for {K} input features")
    natural = torch.arange(K, dtype=torch.long) // gs
    if torch.equal(g, natural):
        return q, None
    _need(int(g.min()) >= 0 and int(g.max()) < G, f"g_idx names groups outside 0..{G - 1}")
    perm = torch.sort(g, stable=True).indices
    _need(torch.equal(g[perm], natural), f"g_idx does not put exactly {gs} input features in each group")
    return q.index_select(1, perm), perm


def _finish(q, scales, zeros, scheme: LayerQuant, N, K, gs, perm) -> GroupQuantWeight:
    bits = scheme.bits
    _need(K % (32 // bits) == 0, f"{K} input features are not whole {32 // bits}-value words")
    if zeros is not None and bool((zeros == 1 << (bits - 1)).all()):
        zeros = None                         # symmetric: the kernels use the constant midpoint
    return GroupQuantWeight(pack_rows(q, bits), scales, zeros, bits, gs, (N, K), perm)


def _from_gptq(p: dict[str, torch.Tensor], s: LayerQuant) -> GroupQuantWeight:
    bits, per = s.bits, 32 // s.bits
    qw = _int32(p["qweight"], "qweight")
    K, N = qw.shape[0] * per, qw.shape[1]
    gs = _group_size(s, K)
    G = _groups(K, gs)
    q = unpack_rows(qw.t(), bits)                                    # [N, K]
    scales = _scales(p["scales"].t(), N, G, "scales (transposed)")
    zeros = None
    if "qzeros" in p:
        qz = _int32(p["qzeros"], "qzeros")
        _need(qz.shape[0] == G and qz.shape[1] * per >= N, f"qzeros has shape {list(qz.shape)}, expected {[G, -(-N // per)]}")
        z = unpack_rows(qz, bits)[:, :N]                             # [G, N]
        zeros = ((z + s.zero_offset) & ((1 << bits) - 1)).t().to(torch.uint8).contiguous()
    elif not s.sym:
        raise _Bad("asymmetric (sym = false) but no qzeros")
    q, perm = _act_order(q, p.get("g_idx"), K, gs, G)
    return _finish(q, scales, zeros, s, N, K, gs, perm)


def _awq_natural(t: torch.Tensor, bits: int) -> torch.Tensor:
    """AWQ words packed along the outputs [R, N / 8] -> values [R, N] in column order."""
    v = unpack_rows(t, bits)
    R, N = v.shape
    return v.view(R, N // 8, 8)[:, :, list(_AWQ_UNDO)].reshape(R, N)


def _from_awq(p: dict[str, torch.Tensor], s: LayerQuant) -> GroupQuantWeight:
    qw = _int32(p["qweight"], "qweight")
    K, N = qw.shape[0], qw.shape[1] * 8
    gs = _group_size(s, K)
    G = _groups(K, gs)
    q = _awq_natural(qw, s.bits).t().contiguous()                    # [N, K]
    scales = _scales(p["scales"].t(), N, G, "scales (transposed)")
    zeros = None
    if "qzeros" in p:
        qz = _int32(p["qzeros"], "qzeros")
        _need(tuple(qz.shape) == (G, N // 8), f"qzeros has shape {list(qz.shape)}, expected {[G, N // 8]}")
        zeros = _awq_natural(qz, s.bits).t().to(torch.uint8).contiguous()
    elif not s.sym:
        raise _Bad("zero_point = true but no qzeros")
    return _finish(q, scales, zeros, s, N, K, gs, None)


def _from_compressed_tensors(p: dict[str, torch.Tensor], s: LayerQuant) -> GroupQuantWeight:
    bits, per = s.bits, 32 // s.bits
    qw = _int32(p["weight_packed"], "weight_packed")
    N = qw.shape[0]
    K = qw.shape[1] * per
    if "weight_shape" in p:
        shape = [int(v) for v in p["weight_shape"].reshape(-1).tolist()]
        _need(len(shape) == 2 and shape[0] == N and shape[1] <= K, f"weight_shape {shape} does not match weight_packed {list(qw.shape)}")
        K = shape[1]
    gs = _group_size(s, K)
    G = _groups(K, gs)
    q = unpack_rows(qw, bits)[:, :K]
    scales = _scales(p["weight_scale"], N, G, "weight_scale")
    zeros = None
    if "weight_zero_point" in p:
        zp = p["weight_zero_point"]
        if zp.dtype == torch.int32 and zp.dim() == 2 and zp.shape[0] == -(-N // per) and zp.shape[1] == G:
            zeros = unpack_rows(zp.t().contiguous(), bits)[:, :N].t()     # packed along N, offset-coded
        else:
            _need(tuple(zp.shape) == (N, G), f"weight_zero_point has shape {list(zp.shape)}, expected {[N, G]} "
                  f"or {[-(-N // per), G]} packed")
            zeros = zp.to(torch.int64) + (1 << (bits - 1))                # signed: to the offset code
        _need(bool(((zeros >= 0) & (zeros < 1 << bits)).all()), "weight_zero_point out of range")
        zeros = zeros.to(torch.uint8).contiguous()
    elif not s.sym:
        raise _Bad("asymmetric (symmetric = false) but no weight_zero_point")
    q, perm = _act_order(q, p.get("weight_g_idx"), K, gs, G)
    return _finish(q, scales, zeros, s, N, K, gs, perm)
