"""Memory of the per-sequence state of a hybrid (full attention + Gated DeltaNet) stack: the
paged KV cache of the full-attention layers and the recurrent + conv state of the linear ones.
One formula, used by the engine when it allocates and by the doctor when it estimates.

Full-attention layer: K and V of num_key_value_heads x head_dim per token.
Linear-attention layer, per sequence: the recurrent state S [Hv, Dk, Dv] (float32 whatever the
model dtype: it accumulates over the whole sequence) and the conv ring of the last K inputs of
the q/k/v channels (model dtype)."""

from __future__ import annotations

import math
from dataclasses import dataclass

from g906.arch.config import ModelConfig

RECURRENT_STATE_BYTES = 4   # float32


@dataclass(frozen=True)
class HybridShape:
    num_full_layers: int
    num_linear_layers: int
    num_key_value_heads: int
    head_dim: int
    linear_num_key_heads: int
    linear_num_value_heads: int
    linear_key_head_dim: int
    linear_value_head_dim: int
    linear_conv_kernel_dim: int

    @classmethod
    def of(cls, c: ModelConfig) -> "HybridShape":
        return cls(len(c.full_attention_layers), len(c.linear_attention_layers), c.num_key_value_heads,
                   c.head_dim, c.linear_num_key_heads, c.linear_num_value_heads, c.linear_key_head_dim,
                   c.linear_value_head_dim, c.linear_conv_kernel_dim)

    def kv_bytes_per_token(self, dtype_bytes: int, tp: int = 1) -> int:
        """K and V of one token across all full-attention layers, on one of tp ranks."""
        return self.num_full_layers * 2 * math.ceil(self.num_key_value_heads / tp) * self.head_dim * dtype_bytes

    def conv_channels(self, tp: int = 1) -> int:
        k, v = math.ceil(self.linear_num_key_heads / tp), math.ceil(self.linear_num_value_heads / tp)
        return 2 * k * self.linear_key_head_dim + v * self.linear_value_head_dim

    def state_bytes_per_sequence(self, dtype_bytes: int, tp: int = 1,
                                 recurrent_bytes: int = RECURRENT_STATE_BYTES) -> int:
        """Recurrent + conv state of one sequence across all linear-attention layers, on one of
        tp ranks."""
        v = math.ceil(self.linear_num_value_heads / tp)
        recurrent = v * self.linear_key_head_dim * self.linear_value_head_dim * recurrent_bytes
        conv = self.conv_channels(tp) * self.linear_conv_kernel_dim * dtype_bytes
        return self.num_linear_layers * (recurrent + conv)
