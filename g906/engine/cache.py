"""Cache tensors of the Qwen3.5 model: a paged KV cache for the full-attention layers and
per-sequence state slots for the linear-attention (Gated DeltaNet) layers.

Full-attention layer i: k_cache[i], v_cache[i] of [num_blocks, block_size, num_kv_heads, head_dim]
(model dtype). Linear layer i: conv_state[i] [num_state_slots, conv_dim, K] (model dtype; a
ring of the last inputs, g906/kernels/conv1d/reference.py) and
ssm_state[i] [num_state_slots, Hv, Dk, Dv] (fp32). Each kind lives in one allocation; the
per-layer entries are views of it."""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from g906.arch.hybrid import HybridShape
from g906.arch.config import ModelConfig


def _itemsize(dtype: torch.dtype) -> int:
    return torch.empty((), dtype=dtype).element_size()


def kv_bytes_per_block(config: ModelConfig, block_size: int, dtype: torch.dtype) -> int:
    """Bytes of K and V for one block of block_size tokens across all full-attention layers."""
    return block_size * HybridShape.of(config).kv_bytes_per_token(_itemsize(dtype))


def state_bytes_per_slot(config: ModelConfig, dtype: torch.dtype) -> int:
    """Bytes of one sequence's linear-attention state across all linear layers (conv state in
    `dtype`, recurrent state in fp32)."""
    return HybridShape.of(config).state_bytes_per_sequence(_itemsize(dtype))


@dataclass
class ModelCache:
    config: ModelConfig
    num_blocks: int
    block_size: int
    num_state_slots: int
    dtype: torch.dtype
    device: torch.device
    kv: torch.Tensor | None = None          # [n_full, 2, num_blocks, block_size, Hkv, D]
    conv: torch.Tensor | None = None        # [n_linear, S, conv_dim, K]
    ssm: torch.Tensor | None = None         # [n_linear, S, Hv, Dk, Dv] fp32
    k_cache: dict[int, torch.Tensor] = field(default_factory=dict)
    v_cache: dict[int, torch.Tensor] = field(default_factory=dict)
    conv_state: dict[int, torch.Tensor] = field(default_factory=dict)
    ssm_state: dict[int, torch.Tensor] = field(default_factory=dict)

    @classmethod
    def allocate(
        cls,
        config: ModelConfig,
        *,
        num_blocks: int,
        block_size: int,
        num_state_slots: int,
        dtype: torch.dtype,
        device,
    ) -> "ModelCache":
        device = torch.device(device)
        full = config.full_attention_layers
        lin = config.linear_attention_layers
        c = cls(config, num_blocks, block_size, num_state_slots, dtype, device)
        c.kv = torch.zeros(
            len(full), 2, num_blocks, block_size, config.num_key_value_heads, config.head_dim,
            dtype=dtype, device=device,
        )
        c.conv = torch.zeros(
            len(lin), num_state_slots, config.linear_conv_dim, config.linear_conv_kernel_dim,
            dtype=dtype, device=device,
        )
        c.ssm = torch.zeros(
            len(lin), num_state_slots, config.linear_num_value_heads, config.linear_key_head_dim,
            config.linear_value_head_dim, dtype=torch.float32, device=device,
        )
        for j, i in enumerate(full):
            c.k_cache[i] = c.kv[j, 0]
            c.v_cache[i] = c.kv[j, 1]
        for j, i in enumerate(lin):
            c.conv_state[i] = c.conv[j]
            c.ssm_state[i] = c.ssm[j]
        return c

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (self.kv, self.conv, self.ssm) if t is not None)

    def reset_slots(self, slots) -> None:
        """Zero the linear-attention states of these slots (a new sequence starts there)."""
        idx = torch.as_tensor(slots, dtype=torch.long, device=self.device).reshape(-1)
        if idx.numel() == 0:
            return
        self.conv.index_fill_(1, idx, 0)
        self.ssm.index_fill_(1, idx, 0)

    def copy_states(self, src, dst) -> None:
        """Copy the linear-attention states of slots src[i] to slots dst[i] (prefix-cache
        snapshots and restores, g906/engine/prefix_cache.py)."""
        if not len(src):
            return
        s = torch.as_tensor(src, dtype=torch.long).to(self.device, non_blocking=True)
        d = torch.as_tensor(dst, dtype=torch.long).to(self.device, non_blocking=True)
        self.conv.index_copy_(1, d, self.conv.index_select(1, s))
        self.ssm.index_copy_(1, d, self.ssm.index_select(1, s))

    def copy_blocks(self, src, dst) -> None:
        """Copy the full-attention KV of blocks src[i] to blocks dst[i] (a forked beam's own copy
        of its parent's partly filled last block, g906/engine/beam.py)."""
        if not len(src):
            return
        s = torch.as_tensor(src, dtype=torch.long).to(self.device, non_blocking=True)
        d = torch.as_tensor(dst, dtype=torch.long).to(self.device, non_blocking=True)
        self.kv.index_copy_(2, d, self.kv.index_select(2, s))
