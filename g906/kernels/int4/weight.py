"""GroupQuantWeight: a 2-D int4/int8 weight with per-group scales (and zero points), kept packed.

The loaders (g906/engine/loaders/hf_quant.py) convert GPTQ, AWQ and compressed-tensors tensors
into this one layout, so every kernel, the tensor-parallel split and the memory accounting deal
with a single format. A routed-expert (MoE) kernel takes the same fields stacked per expert:
qweight [E, N, K * bits / 32], scales / zeros [E, N, G] (see docs/engine.md)."""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch


class GroupQuantFacts:
    """What a packed group-quantized weight and its per-expert stack (experts.py) both answer;
    the input features are the last dimension of shape in both."""

    @property
    def pack(self) -> int:
        """Values per int32 word."""
        return 32 // self.bits

    @property
    def per_channel(self) -> bool:
        return self.group_size >= self.shape[-1]

    def _scheme_parts(self) -> str:
        g = "per-channel" if self.per_channel else f"g{self.group_size}"
        parts = [f"int{self.bits}", g, "asym" if self.zeros is not None else "sym"]
        if self.perm is not None:
            parts.append("act-order")
        return " ".join(parts)

    @property
    def device(self) -> torch.device:
        return self.qweight.device

    @property
    def data(self) -> torch.Tensor:
        """The packed words (what the registry looks at to find the call's device)."""
        return self.qweight

    @property
    def nbytes(self) -> int:
        ts = [self.qweight, self.scales, self.zeros, self.perm]
        return sum(t.numel() * t.element_size() for t in ts if t is not None)

    def to(self, device):
        mv = (lambda t: None if t is None else t.to(device))
        return replace(self, qweight=mv(self.qweight), scales=mv(self.scales), zeros=mv(self.zeros),
                       perm=mv(self.perm))

    def select_cols(self, start: int, count: int):
        """Input features [start, start + count) (of every expert, for the stack; check
        column_split_problem first)."""
        problem = self.column_split_problem(start, count)
        if problem:
            raise ValueError(problem)
        w0, wn = start // self.pack, count // self.pack
        if self.per_channel:
            sl = (lambda t: t)
        else:
            g0, gn = start // self.group_size, -(-count // self.group_size)
            sl = (lambda t: None if t is None else t[..., g0:g0 + gn].contiguous())
        return replace(self, qweight=self.qweight[..., w0:w0 + wn].contiguous(), scales=sl(self.scales),
                       zeros=sl(self.zeros), shape=(*self.shape[:-1], count),
                       group_size=count if self.per_channel else self.group_size)


@dataclass
class GroupQuantWeight(GroupQuantFacts):
    """qweight: int32 [N, K * bits // 32], K-packed (feature k at bits (k % P) * bits of word
    k // P, P = 32 // bits). scales: float16 [N, G]. zeros: uint8 [N, G] or None (symmetric:
    z = 2 ** (bits - 1)). group_size: features per group (K for one group per row). perm: int64
    [K] or None: column j of the weight multiplies input feature perm[j] (act-order, reordered at
    load so groups are contiguous). shape: the logical (N, K)."""

    qweight: torch.Tensor
    scales: torch.Tensor
    zeros: torch.Tensor | None
    bits: int
    group_size: int
    shape: tuple[int, int]
    perm: torch.Tensor | None = None

    def __post_init__(self) -> None:
        self.shape = (int(self.shape[0]), int(self.shape[1]))

    # ------------------------------------------------------------------ facts

    @property
    def num_groups(self) -> int:
        return -(-self.shape[1] // self.group_size)

    @property
    def scheme(self) -> str:
        """e.g. "int4 g128 asym act-order" (messages and logs)."""
        return self._scheme_parts()

    # ------------------------------------------------------------------ moves and splits

    def select_rows(self, index: torch.Tensor) -> "GroupQuantWeight":
        """Output features `index` (any order): rows carry their own words, scales and zeros."""
        idx = index.to(self.qweight.device, torch.long)
        pick = (lambda t: None if t is None else t.index_select(0, idx))
        return replace(self, qweight=pick(self.qweight), scales=pick(self.scales), zeros=pick(self.zeros),
                       shape=(int(idx.numel()), self.shape[1]))

    def column_split_problem(self, start: int, count: int) -> str | None:
        """Why input features [start, start + count) cannot be cut out as a weight of their own
        (None when they can): the cut must fall on whole words, on whole groups (unless one
        group spans the row: then every part keeps the row's scale), and an act-order weight
        has its groups scattered over all features."""
        K = self.shape[1]
        if self.perm is not None:
            return (f"its groups are in act order (desc_act / g_idx): each group of {self.group_size} "
                    f"spans all {K} input features, so no part of them holds whole groups")
        if start % self.pack or count % self.pack:
            return f"features {start}..{start + count - 1} do not fall on whole {self.pack}-value words"
        if not self.per_channel and (start % self.group_size or (count % self.group_size and start + count != K)):
            return (f"a share of {count} input features (from feature {start}) is not a whole number of "
                    f"groups of {self.group_size}")
        return None


def stack_key(w: GroupQuantWeight):
    """Weights with equal keys stack row-wise into one (cat_rows): same packing, groups and
    input order. Act-order weights each have their own permutation: they never stack."""
    if w.perm is not None:
        return None
    return ("group-quant", w.bits, w.group_size, w.shape[1], w.zeros is not None, w.qweight.device)


def cat_rows(ws: list[GroupQuantWeight]) -> GroupQuantWeight:
    cat = (lambda ts: None if ts[0] is None else torch.cat(ts, dim=0))
    return replace(ws[0], qweight=cat([w.qweight for w in ws]), scales=cat([w.scales for w in ws]),
                   zeros=cat([w.zeros for w in ws]), shape=(sum(w.shape[0] for w in ws), ws[0].shape[1]))


def is_group_quant(w) -> bool:
    return isinstance(w, GroupQuantWeight)
