"""Weight slots: how a layer declares the tensors it expects, so the model can load, check
and report them by their Hugging Face names."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from g906.engine.weights import QuantizedTensor, is_quantized
from g906.errors import G906Error


@dataclass(frozen=True)
class WeightSpec:
    shape: tuple[int, ...]
    quantizable: bool = False           # may stay a QuantizedTensor (2-D matmul / embedding weights)
    dtype: torch.dtype | None = None    # fixed dtype (e.g. fp32 for A_log); None = model dtype
    alt_shapes: tuple[tuple[int, ...], ...] = ()  # other accepted layouts, reshaped to `shape`


class WeightHolder(nn.Module):
    """A module whose tensors are declared by weight_specs() and set by set_weight()."""

    def weight_specs(self) -> dict[str, WeightSpec]:
        raise NotImplementedError

    def set_weight(self, attr: str, value: torch.Tensor | QuantizedTensor | None) -> None:
        """Dense tensors of the compute dtype become (frozen) nn.Parameters, so that
        model.parameters() reports the compute dtype; tensors of a fixed dtype (fp32 A_log,
        dt_bias) become buffers; a QuantizedTensor is a plain attribute."""
        self._parameters.pop(attr, None)
        self._buffers.pop(attr, None)
        self.__dict__.pop(attr, None)
        if value is None or is_quantized(value):
            object.__setattr__(self, attr, value)
            return
        spec = self.weight_specs().get(attr)
        if spec is not None and spec.dtype is not None:
            self.register_buffer(attr, value, persistent=False)
        else:
            self.register_parameter(attr, nn.Parameter(value, requires_grad=False))

    def get_weight(self, attr: str):
        return getattr(self, attr, None)


def check_shape(name: str, got: tuple[int, ...], spec: WeightSpec) -> None:
    if tuple(got) == tuple(spec.shape) or tuple(got) in spec.alt_shapes:
        return
    raise G906Error(
        f"tensor {name} has shape {list(got)}, the model config expects {list(spec.shape)}",
        hint="the weights do not match config.json (a different model size or a damaged file?)",
    )
