"""The Qwen3.5 vision tower in PyTorch: flattened image patches -> embeddings in the text
model's hidden size, computed as transformers' Qwen3_5VisionModel computes them.

    tower = VisionTower(cfg, dtype=torch.float16, device="cuda")
    tower.load_weights(pairs)                 # (name, tensor) with names relative to "visual."
    embeds = tower(pixel_values, [(1, gh, gw), ...])   # [sum(gh*gw) / merge^2, out_hidden_size]

Per image (grid t x gh x gw patches, patches in merge-block order as the preprocessor lays
them out):
1. patch embedding: a Conv3d whose kernel equals its stride (temporal x patch x patch), i.e. a
   linear map of each flattened patch;
2. + the learned position table (side x side) resampled to gh x gw, bilinear, align_corners;
3. depth blocks: x += proj(attn(LN1(x))) with full (non-causal) attention inside each frame and
   a 2-D rotary on the whole head dim (first half of the angles from the row, second from the
   column, each over head_dim/4 frequencies, rotate-half form); x += fc2(gelu_tanh(fc1(LN2(x))));
4. the merger: LN per patch, groups of merge^2 consecutive patches concatenated, fc1, exact GELU,
   fc2 into the text hidden size.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from functools import lru_cache

import torch
import torch.nn.functional as F
from torch import nn

from g906.engine.vision.config import VisionConfig
from g906.errors import G906Error

Grid = tuple[int, int, int]
_SCORE_BUDGET = 512 * 1024 * 1024   # bytes of attention scores computed at once


def _act(name: str):
    if name in ("gelu_pytorch_tanh", "gelu_tanh", "gelu_new", "gelu_fast"):
        return lambda x: F.gelu(x, approximate="tanh")
    if name == "gelu":
        return F.gelu
    if name in ("silu", "swish"):
        return F.silu
    if name == "quick_gelu":
        return lambda x: x * torch.sigmoid(1.702 * x)
    raise G906Error(f"vision hidden_act {name!r} is not supported")


class VisionBlock(nn.Module):
    def __init__(self, cfg: VisionConfig):
        super().__init__()
        h = cfg.hidden_size
        self.num_heads = cfg.num_heads
        self.norm1 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.norm2 = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
        self.attn = nn.Module()
        self.attn.qkv = nn.Linear(h, 3 * h)
        self.attn.proj = nn.Linear(h, h)
        self.mlp = nn.Module()
        self.mlp.linear_fc1 = nn.Linear(h, cfg.intermediate_size)
        self.mlp.linear_fc2 = nn.Linear(cfg.intermediate_size, h)
        self.act = _act(cfg.hidden_act)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, segments: list[int]) -> torch.Tensor:
        n, h = x.shape
        heads = self.num_heads
        qkv = self.attn.qkv(self.norm1(x)).view(n, 3, heads, h // heads)
        q, k, v = qkv.unbind(1)
        q = _rotate(q, cos, sin)
        k = _rotate(k, cos, sin)
        outs = []
        start = 0
        for length in segments:  # attention never crosses frames / images
            sl = slice(start, start + length)
            qs, ks, vs = (t[sl].transpose(0, 1)[None] for t in (q, k, v))
            # bound the score matrix of big images (the math SDPA path materialises it)
            step = max(1, min(heads, _SCORE_BUDGET // max(1, length * length * x.element_size())))
            o = torch.cat([F.scaled_dot_product_attention(qs[:, i:i + step], ks[:, i:i + step], vs[:, i:i + step])
                           for i in range(0, heads, step)], dim=1) if step < heads else \
                F.scaled_dot_product_attention(qs, ks, vs)
            outs.append(o[0].transpose(0, 1))
            start += length
        o = torch.cat(outs, 0) if len(outs) > 1 else outs[0]
        x = x + self.attn.proj(o.reshape(n, h))
        return x + self.mlp.linear_fc2(self.act(self.mlp.linear_fc1(self.norm2(x))))


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half rotary over the whole head dim, in float32 (x [N, H, D], cos/sin [N, D])."""
    xf = x.float()
    half = xf.shape[-1] // 2
    rot = torch.cat([-xf[..., half:], xf[..., :half]], dim=-1)
    return (xf * cos[:, None] + rot * sin[:, None]).to(x.dtype)


class VisionTower(nn.Module):
    def __init__(self, cfg: VisionConfig, *, dtype: torch.dtype = torch.float32, device=None):
        super().__init__()
        self.config = cfg
        self.dtype = dtype
        self.device = torch.device(device) if device is not None else torch.device("cpu")
        h = cfg.hidden_size
        with torch.device("meta"):
            self.patch_embed = nn.Module()
            self.patch_embed.proj = nn.Conv3d(
                cfg.in_channels, h,
                kernel_size=(cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size),
                stride=(cfg.temporal_patch_size, cfg.patch_size, cfg.patch_size), bias=True,
            )
            self.pos_embed = nn.Embedding(cfg.num_position_embeddings, h)
            self.blocks = nn.ModuleList([VisionBlock(cfg) for _ in range(cfg.depth)])
            self.merger = nn.Module()
            mh = h * cfg.merge_unit
            self.merger.norm = nn.LayerNorm(h, eps=cfg.layer_norm_eps)
            self.merger.linear_fc1 = nn.Linear(mh, mh)
            self.merger.linear_fc2 = nn.Linear(mh, cfg.out_hidden_size)
        half = cfg.head_dim // 2
        self.inv_freq = 1.0 / (cfg.rope_theta ** (torch.arange(0, half, 2, dtype=torch.float32) / half))
        self.loaded = False

    # ---------------------------------------------------------------- weights

    def expected_shapes(self) -> dict[str, tuple[int, ...]]:
        return {k: tuple(v.shape) for k, v in self.state_dict(keep_vars=True).items()}

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]], source: str = "the checkpoint") -> int:
        """Load (name relative to "visual.", tensor) pairs; every tensor is checked. Returns the
        resident bytes."""
        want = self.expected_shapes()
        got: dict[str, torch.Tensor] = {}
        for name, t in weights:
            if name not in want:
                raise G906Error(f"{source}: unexpected vision tensor {name}",
                                hint="the vision weights do not belong to a Qwen3.5 vision tower with this config")
            if tuple(t.shape) != want[name]:
                raise G906Error(f"{source}: vision tensor {name} has shape {tuple(t.shape)}, expected {want[name]}",
                                hint="the projector was made for a different model")
            if not t.is_floating_point():
                raise G906Error(f"{source}: vision tensor {name} is not floating point ({t.dtype})")
            got[name] = t.to(device=self.device, dtype=self.dtype).contiguous()
        missing = [n for n in want if n not in got]
        if missing:
            more = f" (and {len(missing) - 3} more)" if len(missing) > 3 else ""
            raise G906Error(f"{source}: vision tensor {missing[0]} is missing"
                            + (f"; also {', '.join(missing[1:3])}{more}" if len(missing) > 1 else ""),
                            hint="the vision weights are incomplete")
        if self.dtype == torch.float16:
            for n, t in got.items():
                big = float(t.float().abs().max()) if t.numel() else 0.0
                if big > 65504.0 and big != float("inf"):
                    raise G906Error(f"{source}: vision tensor {n} holds values up to {big:.4g}, beyond float16's range")
        self.load_state_dict(got, assign=True)
        for p in self.parameters():
            p.requires_grad_(False)
        self.inv_freq = self.inv_freq.to(self.device)
        self.loaded = True
        return sum(t.numel() * t.element_size() for t in got.values())

    # ---------------------------------------------------------------- compute

    def tokens_for(self, grid: Grid) -> int:
        t, gh, gw = grid
        return t * gh * gw // self.config.merge_unit

    def _tables(self, grids: Sequence[Grid]):
        """Position-table taps/weights [N, 4], rotary angles cos/sin [N, D], frame lengths."""
        cfg = self.config
        idx, wts, rows, cols, segs = [], [], [], [], []
        for grid in grids:
            i, w, r, c = _grid_tables(tuple(int(x) for x in grid), cfg.spatial_merge_size, cfg.num_grid_per_side)
            idx.append(i)
            wts.append(w)
            rows.append(r)
            cols.append(c)
            segs.extend([grid[1] * grid[2]] * grid[0])
        dev = self.device
        idx_t = torch.cat(idx).to(dev)
        w_t = torch.cat(wts).to(dev)
        r_t = torch.cat(rows).to(dev).float()
        c_t = torch.cat(cols).to(dev).float()
        inv = self.inv_freq
        ang = torch.cat([r_t[:, None] * inv[None], c_t[:, None] * inv[None]], dim=-1)
        ang = torch.cat([ang, ang], dim=-1)
        return idx_t, w_t, ang.cos(), ang.sin(), segs

    @torch.inference_mode()
    def forward(self, pixel_values: torch.Tensor, grids: Sequence[Grid]) -> torch.Tensor:
        if not self.loaded:
            raise G906Error("internal error: the vision tower has no weights")
        cfg = self.config
        n = sum(int(t) * int(h) * int(w) for t, h, w in grids)
        if pixel_values.shape != (n, cfg.patch_dim):
            raise G906Error(f"internal error: pixel values {tuple(pixel_values.shape)} do not match the grids "
                            f"({n} patches of {cfg.patch_dim})")
        for t, gh, gw in grids:
            if gh % cfg.spatial_merge_size or gw % cfg.spatial_merge_size:
                raise G906Error(f"internal error: grid {gh}x{gw} is not a multiple of the merge size")
        x = pixel_values.to(device=self.device, dtype=self.dtype)
        w = self.patch_embed.proj.weight
        x = F.linear(x, w.reshape(w.shape[0], -1), self.patch_embed.proj.bias)
        idx, wts, cos, sin, segs = self._tables(grids)
        pos = (self.pos_embed.weight[idx] * wts[:, :, None]).sum(1)
        x = x + pos.to(x.dtype)
        for blk in self.blocks:
            x = blk(x, cos, sin, segs)
        m = self.merger
        x = m.norm(x).reshape(-1, cfg.hidden_size * cfg.merge_unit)
        return m.linear_fc2(F.gelu(m.linear_fc1(x)))


@lru_cache(maxsize=256)
def _grid_tables(grid: Grid, merge: int, side: int):
    """For one t x gh x gw grid, in merge-block patch order: the 4 bilinear taps into the
    side x side position table and their weights (align_corners=True), and each patch's row and
    column (for the rotary)."""
    t, gh, gw = grid
    # patch order: (block_row, block_col, in_row, in_col)
    br = torch.arange(gh // merge).view(-1, 1, 1, 1)
    bc = torch.arange(gw // merge).view(1, -1, 1, 1)
    ir = torch.arange(merge).view(1, 1, -1, 1)
    ic = torch.arange(merge).view(1, 1, 1, -1)
    row = (br * merge + ir).expand(gh // merge, gw // merge, merge, merge).reshape(-1)
    col = (bc * merge + ic).expand(gh // merge, gw // merge, merge, merge).reshape(-1)

    def taps(index: torch.Tensor, size: int):
        src = index.double() * (side - 1) / max(size - 1, 1)
        lo = src.floor()
        frac = (src - lo).float()
        lo = lo.long()
        i0 = lo.clamp(0, side - 1)
        i1 = (lo + 1).clamp(0, side - 1)
        return torch.stack([i0, i1], -1), torch.stack([1 - frac, frac], -1)

    hi, hw = taps(row, gh)
    wi, ww = taps(col, gw)
    idx = (hi[:, :, None] * side + wi[:, None, :]).reshape(-1, 4)
    wts = (hw[:, :, None] * ww[:, None, :]).reshape(-1, 4)
    if t > 1:
        idx, wts = idx.repeat(t, 1), wts.repeat(t, 1)
        row, col = row.repeat(t), col.repeat(t)
    return idx, wts, row, col


def num_image_tokens(cfg: VisionConfig, grid: Grid) -> int:
    t, gh, gw = grid
    return t * gh * gw // cfg.merge_unit


def estimate_activation_bytes(cfg: VisionConfig, num_patches: int, dtype_bytes: int) -> int:
    """A rough upper bound of the tower's activation peak for num_patches (one frame)."""
    h = cfg.hidden_size
    per_tok = (6 * h + 2 * cfg.intermediate_size) * dtype_bytes + 4 * cfg.head_dim * 4
    attn = cfg.num_heads * num_patches * num_patches * dtype_bytes  # math SDPA scores
    return int(num_patches * per_tok + attn + math.ceil(num_patches / cfg.merge_unit) * h * cfg.merge_unit * 2 * dtype_bytes)
