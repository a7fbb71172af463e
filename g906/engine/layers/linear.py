"""Linear layer over a dense weight or a QuantizedTensor (dequantized inside the matmul)."""

from __future__ import annotations

import torch

from g906.engine.layers import ops
from g906.engine.layers.base import WeightHolder, WeightSpec
from g906.engine.layers.norms import AddNorm, NormedInput
from g906.engine.weights import QuantizedTensor


def _prepare(w):
    from g906.kernels.ops import prepare_linear_weight

    return prepare_linear_weight(w)


def _is_packed(w) -> bool:
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
        if _is_packed(value):
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
    """ops.linear(x, weight) for a tensor or a NormedInput: its 1 / rms applied in the GEMV
    where it can be, else the norm is computed first."""
    if isinstance(x, NormedInput):
        if ops.linear_fuses_norm(x.hn, weight):
            return ops.linear(x.hn, weight, rms_of=(x.ss, x.norm.eps))
        x = x.materialize()
    return ops.linear(x, weight)


def fuse_weights(linears: list[Linear]):
    """One weight computing several projections of the same input in a single matmul: their
    rows stacked. Dense weights of one dtype, or QuantizedTensors of one qtype and row size;
    None when they cannot be stacked (mixed types, as in some GGUF mixes)."""
    ws = [lin.weight for lin in linears]
    if any(w is None for w in ws):
        return None
    if all(isinstance(w, torch.Tensor) for w in ws):
        if len({(w.dtype, w.device, w.shape[1]) for w in ws}) != 1:
            return None
        return torch.cat(ws, dim=0)
    if all(_is_packed(w) for w in ws):
        if len({(w.qtype, w.shape[1], w.device) for w in ws}) != 1:
            return None
        from g906.kernels.linear.repack import cat_rows

        return cat_rows(ws)
    if all(isinstance(w, QuantizedTensor) for w in ws):
        if len({(w.qtype, w.data.shape[1], w.shape[1], w.data.device) for w in ws}) != 1:
            return None
        data = torch.cat([w.data for w in ws], dim=0)
        return QuantizedTensor(data, ws[0].qtype, (int(sum(w.shape[0] for w in ws)), ws[0].shape[1]))
    return None


class FusedProjections:
    """Several Linears over the same input, run as one matmul when their weights stack.

    After fuse(), the member Linears drop their weights (the stacked copy replaces them);
    __call__ returns the per-projection outputs (views of one result)."""

    def __init__(self, linears: list[Linear]):
        self.linears = linears
        self.sizes = [lin.out_features for lin in linears]
        self.weight = None

    def fuse(self) -> None:
        w = fuse_weights(self.linears)
        if w is not None:
            self.weight = w
            for lin in self.linears:
                lin.set_weight("weight", None)

    def __call__(self, x) -> list[torch.Tensor]:
        """x: a tensor or a NormedInput."""
        if self.weight is None:
            if isinstance(x, NormedInput):
                x = x.materialize()
            return [lin(x) for lin in self.linears]
        return list(project(x, self.weight).split(self.sizes, dim=-1))
