"""A request's images as the engine carries them, and the per-step slices the model needs.

    mm = expand_prompt(ids, images, token_ids, merge)   # ids with image_pad x n per image
    ... the engine encodes the images once, at admission (mm.embeds [N, H]) ...
    positions3, index, embeds = step_inputs(seqs, chunks, pos, device)  # the runner, per step

A prompt holds, per image, vision_start, one image_pad, vision_end (the chat template writes
them); expand_prompt repeats the image_pad to the image's token count (merged grid t*h*w).
Chunked prefill can cut an image span anywhere: each chunk takes the embedding rows and M-RoPE
positions of the image tokens it holds, so any chunking computes the same as one prefill."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np
import torch

from g906.engine.vision.image import ImageError, PreparedImage
from g906.engine.vision.mrope import prompt_positions


@dataclass(frozen=True)
class VisionTokenIds:
    image: int
    vision_start: int | None = None
    vision_end: int | None = None


@dataclass
class MultimodalInputs:
    images: list[PreparedImage]
    pad_index: np.ndarray                 # int64 [N]: prompt indices of the image tokens, ascending
    positions: np.ndarray                 # int64 [3, L]: M-RoPE positions of the prompt
    delta: int                            # position of token i >= L is i + delta
    prompt_len: int
    embeds: torch.Tensor | None = None    # [N, hidden] on the model's device, once encoded
    spans: list[tuple[int, int]] = field(default_factory=list)   # (start, length) per image

    @property
    def num_image_tokens(self) -> int:
        return int(self.pad_index.shape[0])

    @property
    def grids(self) -> list[tuple[int, int, int]]:
        return [im.grid for im in self.images]

    def positions_for(self, start: int, n: int) -> np.ndarray:
        """[3, n] positions of tokens start .. start+n-1 (prompt or generated)."""
        end = start + n
        L = self.prompt_len
        if end <= L:
            return self.positions[:, start:end]
        out = np.empty((3, n), dtype=np.int64)
        k = max(0, L - start)
        if k:
            out[:, :k] = self.positions[:, start:L]
        out[:, k:] = np.arange(start + k, end) + self.delta
        return out

    def has_image_tokens(self, start: int, n: int) -> bool:
        lo, hi = np.searchsorted(self.pad_index, [start, start + n])
        return bool(hi > lo)

    def rows_for(self, start: int, n: int) -> tuple[np.ndarray, int, int]:
        """(offsets within the chunk, first embedding row, end row) of the image tokens in
        tokens start .. start+n-1."""
        lo, hi = np.searchsorted(self.pad_index, [start, start + n])
        return self.pad_index[lo:hi] - start, int(lo), int(hi)


def expand_prompt(ids: Sequence[int], images: list[PreparedImage], tok: VisionTokenIds, merge: int
                  ) -> tuple[list[int], MultimodalInputs]:
    """Repeat each image placeholder to its image's token count; the M-RoPE positions of the
    result. The prompt must hold exactly one image placeholder per image."""
    places = [i for i, t in enumerate(ids) if t == tok.image]
    if len(places) != len(images):
        raise ImageError(f"the prompt has {len(places)} image placeholder(s) for {len(images)} image(s)",
                         hint="each image content part becomes one placeholder; do not write image "
                         "tokens into the text yourself")
    out: list[int] = []
    spans: list[tuple[int, int]] = []
    grids = []
    prev = 0
    for place, im in zip(places, images):
        out.extend(ids[prev:place])
        t, gh, gw = im.grid
        mg = (t, gh // merge, gw // merge)
        n = mg[0] * mg[1] * mg[2]
        spans.append((len(out), n))
        grids.append(mg)
        out.extend([tok.image] * n)
        prev = place + 1
    out.extend(ids[prev:])
    pos, delta = prompt_positions(len(out), [(s, g) for (s, _), g in zip(spans, grids)])
    pad_index = np.concatenate([np.arange(s, s + n) for s, n in spans]) if spans else np.zeros(0, np.int64)
    return out, MultimodalInputs(images=list(images), pad_index=pad_index.astype(np.int64), positions=pos,
                                 delta=delta, prompt_len=len(out), spans=spans)


def step_inputs(seqs, chunks: Sequence[int], positions: np.ndarray, device, dtype=None
                ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """For one step's flat batch (sequences with .mm (MultimodalInputs or None) and
    .num_cached_tokens; chunk sizes; the 1-D positions array, changed in place):

    - the 1-D positions of multimodal sequences become their T stream (equal to all three for
      text tokens, so steps without image tokens run the plain rotary);
    - returns ([3, T] positions, flat indices [K], embeddings [K, H] to write over those tokens'
      embeddings), or (None, None, None) when no image token is in the step.
    """
    if not any(getattr(s, "mm", None) is not None for s in seqs):
        return None, None, None
    total = int(sum(chunks))
    need3 = False
    rows3: list[tuple[int, np.ndarray]] = []
    idx_parts: list[np.ndarray] = []
    emb_parts: list[torch.Tensor] = []
    off = 0
    for s, n in zip(seqs, chunks):
        mm = getattr(s, "mm", None)
        if mm is not None:
            start = s.num_cached_tokens
            p3 = mm.positions_for(start, n)
            positions[off:off + n] = p3[0]
            if start < mm.prompt_len and mm.has_image_tokens(start, n):
                if mm.embeds is None:
                    raise RuntimeError("internal error: a multimodal request reached prefill unencoded")
                need3 = True
                rows3.append((off, p3))
                local, lo, hi = mm.rows_for(start, n)
                idx_parts.append(local + off)
                emb_parts.append(mm.embeds[lo:hi])
        off += n
    if not need3:
        return None, None, None
    p = np.tile(positions[:total][None, :], (3, 1))
    for o, p3 in rows3:
        p[:, o:o + p3.shape[1]] = p3
    index = torch.from_numpy(np.concatenate(idx_parts)).to(device)
    embeds = torch.cat(emb_parts, 0) if len(emb_parts) > 1 else emb_parts[0]
    if dtype is not None:
        embeds = embeds.to(dtype)
    return torch.from_numpy(p).to(device), index, embeds.to(device)
