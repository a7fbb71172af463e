"""Image preprocessing against transformers' slow (PIL/numpy) Qwen2-VL image processor, which
Qwen3.5 uses: resize (up to min_pixels, down to max_pixels, multiples of 32), RGB conversion
(grey, palette, alpha on white), normalisation and the merge-block patch layout — exact."""

from __future__ import annotations

import io

import numpy as np
import pytest

from g906.engine.vision.config import VisionConfig
from g906.engine.vision.image import load_image, preprocess, smart_resize
from tests.multimodal.conftest import (
    MAX_PIXELS,
    MIN_PIXELS,
    PREPROCESSOR,
    VISION_CONFIG,
    png_bytes,
)


@pytest.fixture(scope="module")
def vcfg():
    return VisionConfig.from_hf_dict({"vision_config": VISION_CONFIG, "text_config": {"hidden_size": 64}},
                                     PREPROCESSOR)


@pytest.mark.parametrize("size,mode", [
    ((150, 100), "RGB"),      # rounds to 160x96
    ((40, 30), "RGB"),        # below min_pixels: scaled up
    ((700, 500), "RGB"),      # above max_pixels: scaled down
    ((64, 64), "RGB"),        # exact multiple
    ((97, 33), "RGBA"),       # alpha composited on white
    ((80, 120), "L"),         # grey
    ((90, 70), "P"),          # palette
])
def test_pixels_match_transformers(vcfg, hf_processor, size, mode):
    from PIL import Image

    data = png_bytes(*size, seed=size[0], mode="RGBA" if mode == "RGBA" else "RGB")
    img = Image.open(io.BytesIO(data))
    if mode in ("L", "P"):
        img = img.convert(mode)
    ref = hf_processor(images=[img], return_tensors="np")
    mine = preprocess(load_image(img), vcfg)
    assert list(ref["image_grid_thw"][0]) == list(mine.grid)
    assert mine.pixel_values.dtype == np.float32
    np.testing.assert_array_equal(mine.pixel_values, ref["pixel_values"])


def test_smart_resize_bounds():
    for h, w in [(1, 1), (31, 4000), (5000, 5000), (33, 65), (1000, 10)]:
        rh, rw = smart_resize(h, w, 32, MIN_PIXELS, MAX_PIXELS)
        assert rh % 32 == 0 and rw % 32 == 0
        assert MIN_PIXELS <= rh * rw <= MAX_PIXELS or (rh == 32 or rw == 32)
