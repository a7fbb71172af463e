"""Linear layer over a dense weight, a QuantizedTensor or a GroupQuantWeight (dequantized inside
the matmul)."""

from __future__ import annotations

import torch

from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec
from g906.engine.layers.norms import AddNorm, NormedInput
from g906.engine.weights import QuantizedTensor
from g906.kernels.int4.weight import cat_rows as gq_cat_rows, is_group_quant, stack_key as gq_stack_key


def _prepare(w):
    from g906.kernels.ops import prepare_linear_weight

    return prepare_linear_weight(w)


def is_packed(w) -> bool:
    return getattr(w, "planes", None) is not None  # g906.kernels.linear.repack.PackedQuant


class Linear(WeightHolder):
    def __init__(self, in_features: int, out_features: int):
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = None

    def weight_specs(self) -> dict[str, WeightSpec]:
        return {"weight": WeightSpec((self.out_features, self.in_features), quantizable=True)}

    def set_weight(self, attr, value) -> None:
        """A QuantizedTensor on a GPU is repacked once here for the dequant-GEMV kernels
        (g906.kernels.ops.prepare_linear_weight); on the CPU it stays as loaded."""
        if isinstance(value, QuantizedTensor):
            value = _prepare(value)
        if is_packed(value):
            self._parameters.pop(attr, None)
            self._buffers.pop(attr, None)
            object.__setattr__(self, attr, value)
            return
        super().set_weight(attr, value)

    def forward(self, x, then: AddNorm | None = None):
        """self(x) for a tensor or a NormedInput. then: the residual add and RMSNorm that
        follow; done in the GEMV where it can (a NormedInput is returned), else the plain
        output is (the caller's RMSNorm.input_of does them)."""
        if isinstance(x, NormedInput):
            return self.finish(project(x, self.weight))
        return self._out(lambda **kw: ops.linear(x, self.weight, **kw), x, then)

    def forward_silu_mul(self, x: torch.Tensor, then: AddNorm | None = None):
        """self(silu(x[:, :I]) * x[:, I:]): one GEMV kernel in decode where that pays
        (docs/kernels.md, silu_mul_linear). then: as forward's."""
        return self._out(lambda **kw: ops.silu_mul_linear(x, self.weight, **kw), x, then)

    def forward_gated_norm(self, o: torch.Tensor, z: torch.Tensor, norm, then: AddNorm | None = None):
        """self(norm(o, z) flattened) for o, z [T, heads, head_dim] and a GatedRMSNorm. then:
        as forward's."""
        return self._out(lambda **kw: ops.gated_norm_linear(o, z, norm.weight, norm.eps, self.weight, **kw),
                         o.reshape(o.shape[0], -1), then)

    def _out(self, matmul, x: torch.Tensor, then: AddNorm | None):
        """matmul() is the product; matmul(add_norm=...) is (h, hn, ss) (ops.linear)."""
        if then is not None and type(self).finish is Linear.finish and ops.linear_fuses_norm(x, self.weight):
            norm = then.norm
            return NormedInput(*matmul(add_norm=(then.residual, norm.weight, norm.zero_centred)), norm)
        return self.finish(matmul())

    def finish(self, y: torch.Tensor) -> torch.Tensor:
        """What follows the matmul (row-parallel layers all-reduce here: then the residual add
        and norm cannot ride on the GEMV)."""
        return y

    def extra_repr(self) -> str:
        return f"in={self.in_features}, out={self.out_features}"


def project(x, weight):
    """ops.linear(x, weight) for a tensor or a NormedInput (normed_call)."""
    return normed_call(ops.linear, x, weight)


def normed_call(op, x, *weights):
    """op(x, *weights) for a tensor or a NormedInput x: its 1 / rms applied in the GEMVs
    (op's rms_of) where all of them can, else the norm is computed first."""
    if isinstance(x, NormedInput) and all(ops.linear_fuses_norm(x.hn, w) for w in weights):
        return op(x.hn, *weights, rms_of=x.rms_of)
    return op(plain(x), *weights)


def plain(x) -> torch.Tensor:
    """x as a tensor (a NormedInput's RMSNorm computed)."""
    return x.materialize() if isinstance(x, NormedInput) else x


def _stack_key(w):
    """Weights with equal keys stack into one matmul (fuse_weights); None: never stacked."""
    if is_group_quant(w):
        return gq_stack_key(w)
    if isinstance(w, torch.Tensor):
        return ("dense", w.dtype, w.device, w.shape[1])
    if is_packed(w):
        return ("packed", w.qtype, w.shape[1], w.device)
    if isinstance(w, QuantizedTensor):
        return ("gguf", w.qtype, w.data.shape[1], w.shape[1], w.data.device)
    return None


def fuse_weights(linears: list[Linear]):
    """One weight computing several projections of the same input in a single matmul: their
    rows stacked. Dense weights of one dtype, or QuantizedTensors of one qtype and row size;
    None when they cannot be stacked (mixed types, as in some GGUF mixes)."""
    ws = [lin.weight for lin in linears]
    keys = {_stack_key(w) for w in ws}
    if len(keys) != 1 or None in keys:
        return None
    if isinstance(ws[0], torch.Tensor):
        return torch.cat(ws, dim=0)
    if is_group_quant(ws[0]):
        return gq_cat_rows(ws)
    if is_packed(ws[0]):
        from g906.kernels.linear.repack import cat_rows

        return cat_rows(ws)
    data = torch.cat([w.data for w in ws], dim=0)
    return QuantizedTensor(data, ws[0].qtype, (int(sum(w.shape[0] for w in ws)), ws[0].shape[1]))


class FusedProjections:
    """Several Linears over the same input, run as few matmuls as their weights allow.

    fuse() stacks the weights that stack: all of them into one matmul when they are of one
    kind, else one per kind (a GGUF mix such as Q4_K_M has the linear-attention QKV in Q5_K
    and its z, b, a in Q4_K: two GEMVs instead of four). Stacked members drop their weights
    (the stacked copy replaces them); __call__ returns the per-projection outputs (views of
    the matmuls' results)."""

    def __init__(self, linears: list[Linear]):
        self.linears = linears
        self.sizes = [lin.out_features for lin in linears]
        self.stacks: list[tuple[list[int], object]] = []   # (member indices, stacked weight)

    @property
    def weights(self) -> list:
        """The stacked weights (bytes accounting)."""
        return [w for _, w in self.stacks]

    def fuse(self) -> None:
        groups: dict = {}
        for i, lin in enumerate(self.linears):
            key = _stack_key(lin.weight)
            groups.setdefault(key if key is not None else ("alone", i), []).append(i)
        for idx in groups.values():
            w = fuse_weights([self.linears[i] for i in idx]) if len(idx) > 1 else None
            if w is not None:
                self.stacks.append((idx, w))
                for i in idx:
                    self.linears[i].set_weight("weight", None)

    def __call__(self, x) -> list[torch.Tensor]:
        """x: a tensor or a NormedInput. Two matmuls left (two kinds) run as ops.linear_pair:
        one launch on a GPU's decode path."""
        stacked = {i for idx, _ in self.stacks for i in idx}
        mats = self.stacks + [([i], self.linears[i].weight) for i in range(len(self.linears))
                              if i not in stacked]
        if len(mats) == 1:
            return list(project(x, mats[0][1]).split(self.sizes, dim=-1))
        if len(mats) == 2:
            ys = normed_call(ops.linear_pair, x, mats[0][1], mats[1][1])
        else:
            x = plain(x)                 # once, for all the matmuls
            ys = [ops.linear(x, w) for _, w in mats]
        out: list = [None] * len(self.linears)
        for (idx, _), y in zip(mats, ys):
            for i, part in zip(idx, y.split([self.sizes[i] for i in idx], dim=-1)):
                out[i] = part
        return out
