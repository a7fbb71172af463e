"""Multimodal rotary positions (M-RoPE) for the Qwen3.5 text model.

Positions: every prompt token has three position streams (temporal, height, width). Text tokens
have all three equal and advance by one. An image whose merged grid is t x h x w tokens (t = 1
for images), starting at position s, gives its tokens (s + ti, s + hi, s + wi) in row-major grid
order, and the next token starts at s + max(h, w) (transformers' get_rope_index for Qwen3.5).
Tokens after the prompt (generated) continue as text at index + delta, with
delta = max(prompt positions) + 1 - len(prompt).

Rotary: the rotary half-dimension's frequencies are split among the streams in `mrope_section`
(e.g. [11, 11, 10]); interleaved (Qwen3.5): frequency i takes the H stream when i % 3 == 1 and
i < 3 * section[1], the W stream when i % 3 == 2 and i < 3 * section[2], else T. When all three
streams are equal this is the plain rotary, which is why text-only steps need nothing of this.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch


def prompt_positions(length: int, image_spans: Sequence[tuple[int, tuple[int, int, int]]]) -> tuple[np.ndarray, int]:
    """([3, length] int64 positions, delta) for a prompt whose images occupy
    image_spans = [(start index, (t, h, w) merged grid), ...] (sorted, non-overlapping)."""
    pos = np.empty((3, length), dtype=np.int64)
    cur = 0       # next position value
    i = 0         # next token index
    for start, (t, h, w) in image_spans:
        if start < i:
            raise ValueError("image spans overlap or are not sorted")
        n_text = start - i
        pos[:, i:start] = cur + np.arange(n_text)
        cur += n_text
        n = t * h * w
        if start + n > length:
            raise ValueError("an image span runs past the end of the prompt")
        tt, hh, ww = np.meshgrid(np.arange(t), np.arange(h), np.arange(w), indexing="ij")
        pos[0, start:start + n] = cur + tt.reshape(-1)
        pos[1, start:start + n] = cur + hh.reshape(-1)
        pos[2, start:start + n] = cur + ww.reshape(-1)
        cur += max(h, w)
        i = start + n
    pos[:, i:] = cur + np.arange(length - i)
    delta = int(pos.max()) + 1 - length if length else 0
    return pos, delta


def axis_of_frequency(half: int, sections: Sequence[int], interleaved: bool = True) -> np.ndarray:
    """For each of the rotary's `half` frequencies, which stream (0 T, 1 H, 2 W) drives it."""
    sec = list(sections) + [0] * (3 - len(sections))
    axis = np.zeros(half, dtype=np.int64)
    if interleaved:
        for i in range(half):
            if i % 3 == 1 and i < 3 * sec[1]:
                axis[i] = 1
            elif i % 3 == 2 and i < 3 * sec[2]:
                axis[i] = 2
    else:
        a, b = sec[0], sec[0] + sec[1]
        axis[a:b] = 1
        axis[b:b + sec[2]] = 2
    return axis


class MRopeTable:
    """Builds per-step rotary tables ([T, rotary_dim] rows [cos | sin], float32) from [3, T]
    positions, in the layout of the text model's cos/sin cache, so that the same rotary op
    applies them with positions = arange(T)."""

    def __init__(self, rotary_dim: int, theta: float, sections: Sequence[int], interleaved: bool = True):
        half = rotary_dim // 2
        self.rotary_dim = rotary_dim
        self.inv_freq = 1.0 / (theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim))
        self.axis = torch.as_tensor(axis_of_frequency(half, sections, interleaved))
        self._dev: dict = {}

    def _on(self, device):
        key = str(device)
        if key not in self._dev:
            self._dev[key] = (self.inv_freq.to(device), self.axis.to(device))
        return self._dev[key]

    def table(self, positions3: torch.Tensor) -> torch.Tensor:
        inv, axis = self._on(positions3.device)
        # angle[t, i] = positions3[axis[i], t] * inv[i]
        p = positions3.to(torch.float64).index_select(0, axis)          # [half, T]
        ang = p.t() * inv[None, :]
        return torch.cat([ang.cos(), ang.sin()], dim=-1).to(torch.float32)


class StepRotary:
    """A drop-in for the text model's RotaryEmbedding for one step with [3, T] positions:
    rotary(q, k, positions) ignores `positions` and applies this step's M-RoPE table."""

    def __init__(self, table_builder: MRopeTable, positions3: torch.Tensor, rotary_op):
        self.rotary_dim = table_builder.rotary_dim
        self.cos_sin_cache = table_builder.table(positions3)
        self.index = torch.arange(positions3.shape[1], device=positions3.device)
        self.op = rotary_op

    def __call__(self, q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor) -> None:
        self.op(q, k, self.index, self.cos_sin_cache, self.rotary_dim)


_TABLES: dict[tuple, MRopeTable] = {}


def step_rotary(config, positions3: torch.Tensor, rotary_op) -> StepRotary:
    """The StepRotary for a text ModelConfig (rotary_dim, rope_theta, mrope_section,
    mrope_interleaved) and this step's [3, T] positions."""
    key = (config.rotary_dim, float(config.rope_theta), tuple(config.mrope_section), bool(config.mrope_interleaved))
    tb = _TABLES.get(key)
    if tb is None:
        tb = _TABLES[key] = MRopeTable(*key)
    return StepRotary(tb, positions3, rotary_op)
