r"""Load-time repacking of GGUF quantized weights into an aligned, GPU-friendly layout.

GGUF blocks are 18/34/144/176/210 bytes long, so a kernel reading them directly gathers
byte by byte. `prepare(qt)` rewrites a QuantizedTensor once (on its device, with torch ops)
into a `PackedQuant`: a few row-major planes, every plane [rows, ...] contiguous, so a kernel
reads each row with 16-byte vector loads and decodes whole 32-bit words.

Quants are 32-bit words grouped in 16-byte vectors of 4 words = 4E elements (E = 4 for 8-bit
quants, 8 for 4-bit); inside a vector, field j (bits [b*j, b*(j+1))) of word w holds element
4j + w, so the activations one field meets are 4 consecutive elements. Q5_K/Q6_K keep their
high bits in a side plane (Q5_K: an int32 per vector, Q6_K: an int32 per two quant words) with
the bits already where the kernel combines them with the low nibbles.

| type | planes (per row of K elements) | bytes / GGUF bytes |
| --- | --- | --- |
| Q8_0 | qs int32 [K/4] (int8 fields); d fp16 [K/32] | 1.000 |
| Q4_0 | qs int32 [K/8] (nibbles, value q - 8); d fp16 [K/32] | 1.000 |
| Q4_K | qs int32 [K/8]; dm int32 [K/256] (fp16 d, fp16 dmin); scm int16 [K/32] (6-bit scale \| min << 8) | 148/144 = 1.028 |
| Q5_K | qs int32 [K/8] (low nibbles); qh int32 [K/32] (5th bits of a vector, pre-placed: _q5_pos); dm, scm as Q4_K | 180/176 = 1.023 |
| Q6_K | qs int32 [K/8] (low nibbles); qh int32 [K/16] (high bits of 2 quant words, pre-placed: _q6_pos); sc int8 [K/16]; d fp16 [K/256] | 210/210 = 1.000 |

Row pairs (Q4_K with an even number of rows, off ROCm: `row_pairs`): rows 2i and 2i + 1 of
qs hold the two rows' words regrouped, row 2i each word's low halves (fields 0-3 of row 2i, then
of row 2i + 1), row 2i + 1 their high halves (fields 4-7): the pairs the fp16 GEMV multiplies
(two rows' field against one activation in one packed FMA), which it would otherwise build
from every pair of words it loads (byte permutes in its loop). The swap is
its own inverse; other paths and the torch decode swap back (`unpair_rows`). ROCm keeps rows
as they are (its fp32-field GEMVs would pay the swap).

All scales stay exact (GGUF's fp16 d/dmin and integer sub-block scales; products are formed in
fp32 in the kernel), so the packed weight dequantizes bit-for-bit like the GGUF blocks.
Rows stack (`cat_rows`) and select (`select_rows`) plane by plane, as QuantizedTensor's do.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from .._triton_util import is_rocm
from .gguf_blocks import BLOCKS, _scale_min_k4

PACKED_TYPES = ("Q8_0", "Q4_0", "Q4_K", "Q5_K", "Q6_K")


@dataclass
class PackedQuant:
    """A GGUF weight repacked for the GPU kernels (see the module docstring)."""

    qtype: str
    shape: tuple[int, int]
    planes: dict[str, torch.Tensor] = field(default_factory=dict)
    row_pairs: bool = False          # qs stored as row pairs (module docstring)

    @property
    def data(self) -> torch.Tensor:  # the first plane: device / dtype probes (registry)
        return self.planes["qs"]

    @property
    def device(self) -> torch.device:
        return self.planes["qs"].device

    @property
    def nbytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.planes.values())

    def to(self, device) -> "PackedQuant":
        return PackedQuant(self.qtype, self.shape, {k: v.to(device) for k, v in self.planes.items()},
                           self.row_pairs)

    def select_rows(self, index: torch.Tensor) -> "PackedQuant":
        """The rows index, as rows (row pairs: only the selected rows' pairs are swapped back)."""
        index = index.to(self.device)
        planes = {k: v.index_select(0, index) for k, v in self.planes.items()}
        if self.row_pairs:
            first = index - index % 2                           # each row's pair
            both = torch.stack([first, first + 1], 1).reshape(-1)
            rows = _swap_row_halves(self.planes["qs"].index_select(0, both))
            planes["qs"] = rows[2 * torch.arange(index.numel(), device=index.device) + index % 2]
        return PackedQuant(self.qtype, (int(index.numel()), self.shape[1]), planes)

    def dequantize(self) -> torch.Tensor:
        """float32 [rows, K] (torch; the reference path for packed weights)."""
        return dequantize_packed(self)


def cat_rows(ws: list[PackedQuant]) -> PackedQuant:
    """Stack the rows of packed weights of one qtype and K (fused projections): row-paired
    where all are (each has whole pairs), else as rows."""
    q0 = ws[0]
    assert all(w.qtype == q0.qtype and w.shape[1] == q0.shape[1] for w in ws)
    paired = all(w.row_pairs for w in ws)
    if not paired:
        ws = [unpair_rows(w) for w in ws]
    planes = {k: torch.cat([w.planes[k] for w in ws], 0) for k in q0.planes}
    return PackedQuant(q0.qtype, (sum(w.shape[0] for w in ws), q0.shape[1]), planes, paired)


def _swap_row_halves(qs: torch.Tensor) -> torch.Tensor:
    """int32 words [2n, W]: rows 2i, 2i + 1 (a, b) -> (a's low half | b's low half << 16,
    a's high half | b's high half << 16), word by word; its own inverse."""
    q = qs.view(-1, 2, qs.shape[1]).to(torch.int64) & 0xFFFFFFFF
    a, b = q[:, 0], q[:, 1]
    w = torch.stack([(a & 0xFFFF) | ((b & 0xFFFF) << 16), (a >> 16) | (b & 0xFFFF0000)], 1)
    return torch.where(w >= 1 << 31, w - (1 << 32), w).to(torch.int32).view(qs.shape)


def unpair_rows(p: PackedQuant) -> PackedQuant:
    """p with qs as rows (a copy where p is row-paired)."""
    if not p.row_pairs:
        return p
    return PackedQuant(p.qtype, p.shape, {**p.planes, "qs": _swap_row_halves(p.planes["qs"])})


def pairs_rows(qtype: str, rows: int, rocm: bool | None = None) -> bool:
    """Whether pack stores qs as row pairs by default (the module docstring); rocm: for that
    target instead of this machine's (benchmarks/sass.py compiles for either)."""
    return qtype == "Q4_K" and rows % 2 == 0 and not (is_rocm() if rocm is None else rocm)


def can_pack(qt) -> bool:
    return qt.qtype in PACKED_TYPES and qt.shape[1] % 256 == 0 and qt.data.dim() == 2


def _words(q: torch.Tensor, bits: int) -> torch.Tensor:
    """ints [n, m] (natural element order) -> int32 words [n, m*bits/32]: inside each vector
    of 4 words (4E elements, E = 32/bits), field j of word w holds element 4j + w."""
    n, m = q.shape
    e = 32 // bits
    q = (q.to(torch.int64) & ((1 << bits) - 1)).view(n, m // (4 * e), e, 4).transpose(2, 3)
    sh = torch.arange(e, device=q.device, dtype=torch.int64) * bits
    w = (q << sh).sum(-1)                        # disjoint fields: sum == or
    w = torch.where(w >= 1 << 31, w - (1 << 32), w)
    return w.to(torch.int32).reshape(n, m * bits // 32)


def _q6_pos(device):
    """Bit position, in its int32 high word, of the 2 high bits of field j of quant word w of a
    vector (Q6_K): words 2p and 2p+1 share high word p; even fields 2i sit at 8i + 4 (word 2p)
    or 8i (word 2p+1), odd fields 2i+1 two bits higher. The kernel shifts word 2p+1's by 4 and
    masks 0x30303030 (even fields) or shifts by 2 more (odd): the high bits land right above
    the low nibbles of `even = qs & 0x0F0F0F0F` / `odd = (qs >> 4) & 0x0F0F0F0F`."""
    j = torch.arange(8, device=device)[:, None]
    w = torch.arange(4, device=device)[None, :]
    return 8 * (j // 2) + 4 + 2 * (j % 2) - 4 * (w % 2)                # [8 fields, 4 words]


def _q6_high(hi: torch.Tensor) -> torch.Tensor:
    """High 2 bits [n, m] (natural order) -> int32 [n, m/16] (see _q6_pos)."""
    n, m = hi.shape
    q = hi.to(torch.int64).view(n, m // 32, 8, 4)                       # [n, V, j, w]
    v = (q << _q6_pos(hi.device)).view(n, m // 32, 8, 2, 2).sum((2, 4))  # [n, V, p]
    v = torch.where(v >= 1 << 31, v - (1 << 32), v)
    return v.to(torch.int32).reshape(n, m // 16)


def _q6_unhigh(w: torch.Tensor) -> torch.Tensor:
    n = w.shape[0]
    w = w.to(torch.int64).view(n, -1, 1, 2, 1) & 0xFFFFFFFF                # [n, V, 1, p, 1]
    pos = _q6_pos(w.device).view(1, 1, 8, 2, 2)                          # [.., j, p, r]
    q = (w >> pos) & 3                                                   # [n, V, j, p, r]
    return q.reshape(n, -1)                                              # element 4j + w


def _q5_pos(device):
    """Bit of the 5th bit of field j of quant word w in the vector's int32 high word (Q5_K):
    8 * (j // 2) + 2w + j % 2. The kernel shifts word w's by 4 - 2w (w = 3: right by 2) so even
    fields land on bit 4 of their byte slot (odd fields one higher, shifted down by 1)."""
    j = torch.arange(8, device=device)[:, None]
    w = torch.arange(4, device=device)[None, :]
    return 8 * (j // 2) + 2 * w + j % 2                                  # [8 fields, 4 words]


def _q5_high(hb: torch.Tensor) -> torch.Tensor:
    """5th bits [n, m] (natural order) -> int32 [n, m/32], one per vector (see _q5_pos)."""
    n, m = hb.shape
    q = hb.to(torch.int64).view(n, m // 32, 8, 4)                       # [n, V, j, w]
    v = (q << _q5_pos(hb.device)).sum((2, 3))
    v = torch.where(v >= 1 << 31, v - (1 << 32), v)
    return v.to(torch.int32)


def _q5_unhigh(w: torch.Tensor) -> torch.Tensor:
    n = w.shape[0]
    w = w.to(torch.int64)[:, :, None, None] & 0xFFFFFFFF
    return ((w >> _q5_pos(w.device)) & 1).reshape(n, -1)                # element 4j + w


# elements repacked per step: bounds the int64/int32 per-element temporaries (~8 x this many
# bytes) however large the weight (a 248k x 5120 output projection is 1.3G elements)
CHUNK_ELEMENTS = 1 << 22


@torch.no_grad()
def pack(raw: torch.Tensor, qtype: str, shape, row_pairs: bool | None = None) -> PackedQuant:
    """raw GGUF blocks uint8 [rows, row_bytes] -> PackedQuant, on raw's device; rows are
    repacked in chunks into preallocated planes (peak memory: raw + packed + one chunk).
    row_pairs: qs as row pairs (default pairs_rows; needs Q4_K and an even number of rows)."""
    rows, K = int(shape[0]), int(shape[1])
    if row_pairs is None:
        row_pairs = pairs_rows(qtype, rows)
    assert not row_pairs or (qtype == "Q4_K" and rows % 2 == 0), (qtype, rows)
    raw = raw.reshape(rows, -1)
    step = max(2, CHUNK_ELEMENTS // max(1, K) // 2 * 2)      # whole row pairs a chunk
    if rows <= step:
        return _pack_rows(raw, qtype, rows, K, row_pairs)
    first = _pack_rows(raw[:step], qtype, step, K, row_pairs)
    planes = {k: torch.empty((rows,) + tuple(v.shape[1:]), dtype=v.dtype, device=v.device)
              for k, v in first.planes.items()}
    for k, v in first.planes.items():
        planes[k][:step] = v
    del first
    for r0 in range(step, rows, step):
        r1 = min(rows, r0 + step)
        part = _pack_rows(raw[r0:r1], qtype, r1 - r0, K, row_pairs)
        for k, v in part.planes.items():
            planes[k][r0:r1] = v
    return PackedQuant(qtype, (rows, K), planes, row_pairs)


def _pack_rows(raw: torch.Tensor, qtype: str, rows: int, K: int,
               row_pairs: bool = False) -> PackedQuant:
    be, bb = BLOCKS[qtype]
    blocks = raw.reshape(-1, bb)
    nb = blocks.shape[0]
    if qtype == "Q8_0":
        d = blocks[:, 0:2].contiguous().view(torch.float16).reshape(rows, K // 32)
        q = blocks[:, 2:34].contiguous().view(torch.int8).reshape(rows, K)
        return PackedQuant(qtype, (rows, K), {"qs": _words(q, 8), "d": d.contiguous()})
    if qtype == "Q4_0":
        d = blocks[:, 0:2].contiguous().view(torch.float16).reshape(rows, K // 32)
        b = blocks[:, 2:18].to(torch.int32)
        q = torch.cat([b & 15, b >> 4], 1)                                  # [nb, 32] natural
        qs = _words(q.reshape(rows, K), 4)
        return PackedQuant(qtype, (rows, K), {"qs": qs, "d": d.contiguous()})
    if qtype in ("Q4_K", "Q5_K"):
        dm = blocks[:, 0:4].contiguous().view(torch.int32).reshape(rows, K // 256)
        sc, m = _scale_min_k4(blocks[:, 4:16])                              # [nb, 8] uint8
        scm = (sc.to(torch.int32) | (m.to(torch.int32) << 8)).to(torch.int16)  # < 2^14: fits
        qoff = 16 if qtype == "Q4_K" else 48
        b = blocks[:, qoff:qoff + 128].to(torch.int32).view(nb, 4, 32)
        q = torch.stack([b & 15, b >> 4], 2).reshape(nb, 256)              # sub-block 2g+hi
        qs = _words(q.reshape(rows, K), 4)
        planes = {"qs": _swap_row_halves(qs) if row_pairs else qs, "dm": dm.contiguous(),
                  "scm": scm.reshape(rows, K // 32).contiguous()}
        if qtype == "Q5_K":
            qh = blocks[:, 16:48].to(torch.int32)                           # [nb, 32]
            hb = torch.stack([(qh >> j) & 1 for j in range(8)], 1).reshape(nb, 256)
            planes["qh"] = _q5_high(hb.reshape(rows, K))
        return PackedQuant(qtype, (rows, K), planes, row_pairs)
    if qtype == "Q6_K":
        ql = blocks[:, 0:128].to(torch.int32).view(nb, 2, 64)
        qh = blocks[:, 128:192].to(torch.int32).view(nb, 2, 32)
        lo_parts, hi_parts = [], []
        for qq in range(4):                         # element 128h + 32qq + l
            lo_parts.append((ql[:, :, 32 * (qq & 1):32 * (qq & 1) + 32] >> (4 * (qq >> 1))) & 15)
            hi_parts.append((qh >> (2 * qq)) & 3)
        lo = torch.stack(lo_parts, 2).reshape(nb, 256)
        hi = torch.stack(hi_parts, 2).reshape(nb, 256)
        sc = blocks[:, 192:208].contiguous().view(torch.int8).reshape(rows, K // 16)
        d = blocks[:, 208:210].contiguous().view(torch.float16).reshape(rows, K // 256)
        return PackedQuant(qtype, (rows, K), {
            "qs": _words(lo.reshape(rows, K), 4),
            "qh": _q6_high(hi.reshape(rows, K)),
            "sc": sc.contiguous(), "d": d.contiguous()})
    raise ValueError(f"no packed layout for {qtype}")


def prepare(qt):
    """QuantizedTensor on a GPU -> PackedQuant (once, at load time); anything else as is."""
    if isinstance(qt, PackedQuant) or not hasattr(qt, "qtype"):
        return qt
    if qt.data.device.type == "cpu" or not can_pack(qt):
        return qt
    return pack(qt.data, qt.qtype, qt.shape)


# ------------------------------------------------------------------ torch decode (reference)

def _unwords(w: torch.Tensor, bits: int, signed: bool = False) -> torch.Tensor:
    """Inverse of _words: int32 words [n, W] -> ints [n, W*32/bits] in natural order."""
    n = w.shape[0]
    e = 32 // bits
    sh = torch.arange(e, device=w.device, dtype=torch.int64) * bits
    f = (w.to(torch.int64)[:, :, None] >> sh) & ((1 << bits) - 1)        # [n, V*4, E]
    if signed:
        f = torch.where(f >= 1 << (bits - 1), f - (1 << bits), f)
    return f.view(n, -1, 4, e).transpose(2, 3).reshape(n, -1)


def dequantize_packed(p: PackedQuant) -> torch.Tensor:
    p = unpair_rows(p)
    rows, K = p.shape
    P = p.planes
    if p.qtype == "Q8_0":
        d = P["d"].float().repeat_interleave(32, 1)
        return _unwords(P["qs"], 8, signed=True).float() * d
    if p.qtype == "Q4_0":
        d = P["d"].float().repeat_interleave(32, 1)
        return (_unwords(P["qs"], 4).float() - 8.0) * d
    if p.qtype in ("Q4_K", "Q5_K"):
        dm = P["dm"].contiguous().view(torch.float16).float().view(rows, K // 256, 2)
        d = dm[..., 0].repeat_interleave(8, 1)
        dmin = dm[..., 1].repeat_interleave(8, 1)
        scm = P["scm"].to(torch.int32)
        sc = (scm & 255).float()
        m = (scm >> 8).float()
        q = _unwords(P["qs"], 4)
        if p.qtype == "Q5_K":
            q = q + 16 * _q5_unhigh(P["qh"])
        q = q.float().view(rows, K // 32, 32)
        y = (d * sc)[..., None] * q - (dmin * m)[..., None]
        return y.reshape(rows, K)
    if p.qtype == "Q6_K":
        q = (_unwords(P["qs"], 4) + 16 * _q6_unhigh(P["qh"])).float() - 32.0
        d = P["d"].float().repeat_interleave(16, 1)
        s = (d * P["sc"].float()).repeat_interleave(16, 1)
        return q * s
    raise ValueError(p.qtype)
