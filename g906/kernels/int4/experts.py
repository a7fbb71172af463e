"""GroupQuantExperts: the routed experts of one MoE projection as int4/int8 groups, kept packed.

GPTQ, AWQ and compressed-tensors MoE checkpoints store one quantized module per expert; the
loader converts each into a GroupQuantWeight (weight.py) and the model stacks the E of a
projection into this container, so the routed kernels (g906/kernels/moe/int4.py) address
expert e's rows by one stride, as they do for GGUF blocks.

Act order: each expert of an act-order checkpoint has its own permutation of the input
features (its columns were reordered at load so its groups are contiguous). The kernels do not
gather inside their loops: the activations of each (token, expert) pair are permuted once per
call, before the kernel, by the chosen expert's permutation (moe/int4.py)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from .reference import unpack_rows
from .weight import GroupQuantFacts, GroupQuantWeight


@dataclass
class GroupQuantExperts(GroupQuantFacts):
    """qweight: int32 [E, N, K * bits // 32] (K-packed as GroupQuantWeight). scales: float16
    [E, N, G]. zeros: uint8 [E, N, G] or None (symmetric: z = 2 ** (bits - 1)). perm: int64
    [E, S, K] or None: act order; the rows fall into S equal sections (S = 2 when gate and up of
    different permutations are stacked into one gate_up weight), and column j of section s of
    expert e multiplies input feature perm[e, s, j]. shape: the logical (E, N, K)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bits: int
    group_size: int
    shape: tuple[int, int, int]
    perm: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.shape = tuple(int(s) for s in self.shape)

    # ------------------------------------------------------------------ facts

    @property
    def scheme(self) -> str:
        return self._scheme_parts() + f", {self.shape[0]} experts"

    # ------------------------------------------------------------------ building

    @staticmethod
    def stack_problem(ws: list[GroupQuantWeight]) -> str | None:
        """Why the experts' weights cannot share one container (None when they can)."""
        w0 = ws[0]
        for e, w in enumerate(ws):
            if (w.bits, w.group_size, w.shape) != (w0.bits, w0.group_size, w0.shape):
                return (f"expert {e} is {w.scheme} {list(w.shape)} but expert 0 is {w0.scheme} "
                        f"{list(w0.shape)}")
        return None

    @classmethod
    def stack(cls, ws: list[GroupQuantWeight]) -> "GroupQuantExperts":
        """The E experts of one projection (check stack_problem first). Experts whose zero points
        all sit at the midpoint came without zeros (weight.py keeps none then): they get them
        back when another expert has its own; likewise an identity permutation."""
        w0 = ws[0]
        N, K = w0.shape
        zeros = None
        if any(w.zeros is not None for w in ws):
            mid = torch.full((N, w0.scales.shape[1]), 1 << (w0.bits - 1), dtype=torch.uint8)
            zeros = torch.stack([w.zeros if w.zeros is not None else mid.to(w.scales.device) for w in ws])
        perm = None
        if any(w.perm is not None for w in ws):
            ident = torch.arange(K, dtype=torch.long)
            perm = torch.stack([(w.perm if w.perm is not None else ident.to(w.qweight.device)).long()
                                for w in ws])[:, None, :].contiguous()
        return cls(torch.stack([w.qweight for w in ws]), torch.stack([w.scales for w in ws]), zeros,
                   w0.bits, w0.group_size, (len(ws), N, K), perm)

    def cat_key(self):
        """Containers with equal keys stack row-wise (cat_rows): gate and up into gate_up."""
        return (self.bits, self.group_size, self.shape[0], self.shape[2], self.qweight.device)

    @staticmethod
    def cat_rows(parts: "list[GroupQuantExperts]") -> "GroupQuantExperts":
        """[gate; up] of every expert. Zero points (and permutations) are filled in for a part
        without them; permutations that agree keep one section, else one per part."""
        p0 = parts[0]
        if any(p.zeros is not None for p in parts):
            zs = [p.zeros if p.zeros is not None else torch.full_like(p.scales, 1 << (p.bits - 1), dtype=torch.uint8)
                  for p in parts]
            zeros = torch.cat(zs, dim=1)
        else:
            zeros = None
        perm = None
        if any(p.perm is not None for p in parts):
            E, _, K = p0.shape
            ident = torch.arange(K, dtype=torch.long, device=p0.device).expand(E, 1, K)
            ps = [p.perm if p.perm is not None else ident for p in parts]
            if all(q.shape[1] == 1 for q in ps) and all(torch.equal(q, ps[0]) for q in ps[1:]):
                perm = ps[0].contiguous()
            elif all(q.shape[1] == 1 for q in ps):
                perm = torch.cat(ps, dim=1).contiguous()
            else:
                raise ValueError("act-order experts stack only one level deep")
        return replace(p0, qweight=torch.cat([p.qweight for p in parts], dim=1),
                       scales=torch.cat([p.scales for p in parts], dim=1), zeros=zeros, perm=perm,
                       shape=(p0.shape[0], sum(p.shape[1] for p in parts), p0.shape[2]))

    # ------------------------------------------------------------------ splits (tensor parallel)

    def select_rows(self, index: torch.Tensor) -> "GroupQuantExperts":
        """The same output rows of every expert (a single permutation section only)."""
        if self.perm is not None and self.perm.shape[1] != 1:
            raise ValueError("rows of a two-section act-order weight are taken per section")
        idx = index.to(self.device, torch.long)
        pick = (lambda t: None if t is None else t.index_select(1, idx))
        return replace(self, qweight=pick(self.qweight), scales=pick(self.scales), zeros=pick(self.zeros),
                       shape=(self.shape[0], int(idx.numel()), self.shape[2]))

    def expert(self, e: int) -> GroupQuantWeight:
        """Expert e as a 2-D weight (one permutation section)."""
        if self.perm is not None and self.perm.shape[1] != 1:
            raise ValueError("a two-section act-order weight has no single 2-D form")
        return GroupQuantWeight(self.qweight[e], self.scales[e], None if self.zeros is None else self.zeros[e],
                                self.bits, self.group_size, self.shape[1:],
                                None if self.perm is None else self.perm[e, 0])

    def column_split_problem(self, start: int, count: int) -> str | None:
        w = GroupQuantWeight(self.qweight[0], self.scales[0], None, self.bits, self.group_size, self.shape[1:],
                             None if self.perm is None else self.perm[0, 0])
        return w.column_split_problem(start, count)

    # ------------------------------------------------------------------ reference

    def dequantize_experts(self, ids: torch.Tensor) -> torch.Tensor:
        """float32 [len(ids), N, K] of experts ids, in the input features' order (the routed
        experts' reference, g906/kernels/moe/reference.py)."""
        ids = ids.to(self.device, torch.long)
        _, N, K = self.shape
        q = unpack_rows(self.qweight.index_select(0, ids), self.bits)[..., :K]
        gid = torch.arange(K, device=q.device) // self.group_size
        s = self.scales.index_select(0, ids).float()[..., gid]
        z = (self.zeros.index_select(0, ids).to(torch.int64)[..., gid] if self.zeros is not None
             else torch.full((), 1 << (self.bits - 1), dtype=torch.int64, device=q.device))
        out = (q - z).float() * s
        if self.perm is None:
            return out
        S = self.perm.shape[1]
        perm = self.perm.index_select(0, ids)                                  # [n, S, K]
        rows = perm.repeat_interleave(N // S, dim=1)                           # [n, N, K]
        full = torch.empty_like(out)
        full.scatter_(2, rows, out)
        return full


def is_group_quant_experts(w) -> bool:
    return isinstance(w, GroupQuantExperts)
