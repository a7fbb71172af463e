"""M-RoPE positions and placeholder expansion against transformers' get_rope_index, and the
per-step slices (positions, embedding rows) for any chunking."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from g906.engine.vision.image import ImageError, PreparedImage
from g906.engine.vision.inputs import VisionTokenIds, expand_prompt, step_inputs
from g906.engine.vision.mrope import axis_of_frequency

IMG, VS, VE = 452, 450, 451


def _img(gh: int, gw: int) -> PreparedImage:
    return PreparedImage(np.zeros((gh * gw, 8), np.float32), (1, gh, gw), (gw * 16, gh * 16), (gw * 16, gh * 16))


@pytest.mark.parametrize("grids,text", [
    ([], [1, 2, 3]),
    ([(4, 6)], [1, 2, VS, IMG, VE, 3, 4]),
    ([(6, 2), (2, 8)], [VS, IMG, VE, 7, VS, IMG, VE, 8, 9, 10]),
    ([(2, 2)], [5, VS, IMG, VE]),
])
def test_positions_match_transformers(vl_hf_model, grids, text):
    tok = VisionTokenIds(vl_hf_model.config.image_token_id, VS, VE)
    text = [tok.image if t == IMG else t for t in text]
    ids, mm = expand_prompt(text, [_img(*g) for g in grids], tok, 2)
    assert len(ids) == len(text) - len(grids) + sum(h * w // 4 for h, w in grids)
    inp = torch.tensor([ids])
    tt = (inp == tok.image).int()
    grid_thw = torch.tensor([[1, h, w] for h, w in grids]) if grids else None
    if grids:
        ref, delta = vl_hf_model.model.get_rope_index(inp, tt, grid_thw)
        np.testing.assert_array_equal(mm.positions, ref[:, 0].numpy())
        assert mm.delta == int(delta)
    else:
        np.testing.assert_array_equal(mm.positions, np.tile(np.arange(len(ids)), (3, 1)))
        assert mm.delta == 0
    assert list(mm.pad_index) == [i for i, t in enumerate(ids) if t == tok.image]


def test_placeholder_count_must_match():
    tok = VisionTokenIds(IMG, VS, VE)
    with pytest.raises(ImageError, match="1 image placeholder"):
        expand_prompt([VS, IMG, VE], [_img(2, 2), _img(2, 2)], tok, 2)


def test_interleaved_sections():
    # transformers: H on slice(1, 3*s_h, 3), W on slice(2, 3*s_w, 3), the rest T
    axis = axis_of_frequency(32, [11, 11, 10])
    assert list(axis[:6]) == [0, 1, 2, 0, 1, 2]
    assert axis[30] == 0 and axis[31] == 1 and axis[29] == 2 and axis[28] == 1
    assert list(axis_of_frequency(6, [2, 2, 2], interleaved=False)) == [0, 0, 1, 1, 2, 2]


class _Seq:
    def __init__(self, mm, cached):
        self.mm = mm
        self.num_cached_tokens = cached


def test_step_slices_cover_any_chunking():
    tok = VisionTokenIds(IMG, VS, VE)
    ids, mm = expand_prompt([1, VS, IMG, VE, 2, VS, IMG, VE, 3], [_img(4, 4), _img(2, 6)], tok, 2)
    mm.embeds = torch.arange(mm.num_image_tokens, dtype=torch.float32)[:, None].repeat(1, 3)
    L = len(ids)
    for cut in ([L], [3, 4, L - 7], [1] * L):
        start, rows = 0, []
        for n in cut:
            pos = np.arange(start, start + n)
            p3, idx, emb = step_inputs([_Seq(mm, start)], [n], pos, "cpu")
            full = mm.positions[:, start:start + n]
            if p3 is None:
                assert (full == full[0]).all() and idx is None and emb is None
                np.testing.assert_array_equal(pos, full[0])
            else:
                np.testing.assert_array_equal(p3.numpy(), full)
                assert [ids[start + int(i)] for i in idx] == [IMG] * len(idx)
                rows.extend(emb[:, 0].long().tolist())
            start += n
        assert rows == list(range(mm.num_image_tokens))
    # generated tokens continue at index + delta, as text
    pos = np.zeros(1, np.int64)
    p3, idx, emb = step_inputs([_Seq(mm, L + 3)], [1], pos, "cpu")
    assert p3 is None and idx is None and emb is None and pos[0] == L + 3 + mm.delta


def test_text_sequences_keep_their_positions():
    tok = VisionTokenIds(IMG, VS, VE)
    ids, mm = expand_prompt([1, VS, IMG, VE, 2], [_img(4, 4)], tok, 2)
    mm.embeds = torch.zeros(mm.num_image_tokens, 3)
    plain = _Seq(None, 10)
    pos = np.concatenate([np.arange(10, 13), np.arange(0, len(ids))])
    p3, idx, _ = step_inputs([plain, _Seq(mm, 0)], [3, len(ids)], pos, "cpu")
    np.testing.assert_array_equal(p3[:, :3].numpy(), np.tile(np.arange(10, 13), (3, 1)))
    np.testing.assert_array_equal(p3[:, 3:].numpy(), mm.positions)
    assert idx.min() >= 3
