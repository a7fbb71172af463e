"""The vision tower against transformers (fp32, rel err < 1e-4): weights from the HF checkpoint
(model.visual.*) and from a llama.cpp-layout mmproj GGUF (F32 exact-ish, F16/Q8_0 looser), one
and several images (per-image attention, odd grids, position-table interpolation)."""

from __future__ import annotations

import io

import numpy as np
import pytest
import torch

from g906.engine.vision.config import VisionConfig
from g906.engine.vision.image import load_image, preprocess
from g906.engine.vision.tower import VisionTower
from g906.engine.vision.weights import MmprojFile, hf_vision_weights
from g906.errors import G906Error
from tests.engine.conftest import rel_err
from tests.multimodal.conftest import png_bytes

SIZES = [(150, 100), (64, 96), (250, 40)]


def _images():
    from PIL import Image

    return [Image.open(io.BytesIO(png_bytes(w, h, seed=i))) for i, (w, h) in enumerate(SIZES)]


@torch.no_grad()
def _reference(model, processor, images):
    feats = processor(images=images, return_tensors="pt")
    out = model.model.get_image_features(feats["pixel_values"], feats["image_grid_thw"])
    return torch.cat(list(out.pooler_output), 0), feats


@pytest.fixture(scope="module")
def hf_tower(vl_hf_dir):
    cfg = VisionConfig.from_hf_dir(vl_hf_dir)
    tower = VisionTower(cfg)
    tower.load_weights(hf_vision_weights(vl_hf_dir))
    return tower


def _run(tower, images, pre_cfg=None):
    prepared = [preprocess(load_image(im), pre_cfg or tower.config) for im in images]
    pv = torch.from_numpy(np.concatenate([p.pixel_values for p in prepared]))
    return tower(pv, [p.grid for p in prepared]), prepared


def test_config_from_hf_dir(vl_hf_dir):
    cfg = VisionConfig.from_hf_dir(vl_hf_dir)
    assert (cfg.depth, cfg.hidden_size, cfg.num_heads, cfg.patch_size, cfg.temporal_patch_size) == (2, 32, 2, 16, 2)
    assert (cfg.out_hidden_size, cfg.num_grid_per_side, cfg.min_pixels, cfg.max_pixels) == (64, 4, 64 * 64, 256 * 256)


@pytest.mark.parametrize("which", [[0], [1], [0, 1, 2]])
def test_hf_weights_match_transformers(hf_tower, vl_hf_model, hf_processor, which):
    images = [_images()[i] for i in which]
    ref, feats = _reference(vl_hf_model, hf_processor, images)
    mine, prepared = _run(hf_tower, images)
    assert [list(p.grid) for p in prepared] == feats["image_grid_thw"].tolist()
    assert mine.shape == ref.shape
    assert rel_err(mine, ref) < 1e-4


def test_mmproj_config_and_names(vl_gguf_dir, vl_hf_dir):
    f = MmprojFile(vl_gguf_dir / "mmproj-tiny-vl-F32.gguf")
    assert f.config().to_json() | {"source": ""} == VisionConfig.from_hf_dir(vl_hf_dir).to_json() | {
        "source": "", "min_pixels": f.config().min_pixels, "max_pixels": f.config().max_pixels}
    names = set(f.file.tensor_names())
    assert {"v.patch_embd.weight", "v.patch_embd.weight.1", "v.position_embd.weight", "v.blk.1.attn_qkv.weight",
            "v.post_ln.weight", "mm.0.weight", "mm.2.bias"} <= names


@pytest.mark.parametrize("qtype,tol", [("F32", 1e-4), ("F16", 3e-3), ("Q8_0", 3e-2)])
def test_mmproj_matches_transformers(vl_hf_dir, vl_hf_model, hf_processor, tmp_path, qtype, tol):
    from tests.multimodal.mmproj_writer import write_mmproj

    path = write_mmproj(vl_hf_dir, tmp_path / f"mmproj-{qtype}.gguf", qtype=qtype)
    f = MmprojFile(path)
    tower = VisionTower(f.config())
    tower.load_weights(f.weights())
    images = _images()
    ref, _ = _reference(vl_hf_model, hf_processor, images)
    # the GGUF carries no min/max pixels: preprocess with the checkpoint's settings
    mine, _ = _run(tower, images, VisionConfig.from_hf_dir(vl_hf_dir))
    assert rel_err(mine, ref) < tol


def test_float16_tower_close(vl_hf_dir, vl_hf_model, hf_processor):
    cfg = VisionConfig.from_hf_dir(vl_hf_dir)
    tower = VisionTower(cfg, dtype=torch.bfloat16)
    tower.load_weights(hf_vision_weights(vl_hf_dir))
    ref, _ = _reference(vl_hf_model, hf_processor, _images()[:1])
    mine, _ = _run(tower, _images()[:1])
    assert mine.dtype == torch.bfloat16
    assert rel_err(mine.float(), ref) < 3e-2


def test_bad_weights_are_named(vl_hf_dir):
    cfg = VisionConfig.from_hf_dir(vl_hf_dir)
    pairs = dict(hf_vision_weights(vl_hf_dir))
    with pytest.raises(G906Error, match="blocks.1.attn.qkv.weight is missing"):
        VisionTower(cfg).load_weights((k, v) for k, v in pairs.items() if k != "blocks.1.attn.qkv.weight")
    bad = dict(pairs)
    bad["merger.linear_fc2.weight"] = torch.zeros(3, 3)
    with pytest.raises(G906Error, match=r"merger.linear_fc2.weight has shape \(3, 3\)"):
        VisionTower(cfg).load_weights(bad.items())
    with pytest.raises(G906Error, match="unexpected vision tensor deepstack"):
        VisionTower(cfg).load_weights(list(pairs.items()) + [("deepstack.0.x", torch.zeros(1))])
