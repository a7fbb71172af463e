"""Image sources and their failures: data: URLs, local paths (only where allowed), http(s) from a
real loopback server (size and time limits), bad bytes, size limits, image content parts."""

from __future__ import annotations

import http.server
import threading
import time

import pytest

from g906.engine.vision.glue import image_part_url
from g906.engine.vision.image import ImageError, ImageLimits, load_image
from tests.multimodal.conftest import data_url, png_bytes

PNG = png_bytes(40, 30)


def test_data_url_roundtrip():
    img = load_image(data_url(PNG))
    assert img.size == (40, 30) and img.mode == "RGB"
    assert load_image(data_url(PNG, "image/png").replace("base64,", "base64,\n")).size == (40, 30)
    assert load_image(PNG).size == (40, 30)


@pytest.mark.parametrize("url,msg", [
    ("data:image/png;base64,!!!notbase64", "not valid base64"),
    ("data:text/plain;base64,aGVsbG8=", "holds 'text/plain', not an image"),
    ("data:image/png,rawdata", "only base64 data: URLs"),
    ("data:image/png;base64,aGVsbG8=", "not an image Pillow can read"),
    ("data:image/png;base64,", "empty"),
    ("ftp://example.com/x.png", "unsupported URL scheme"),
    ("", "empty"),
])
def test_bad_sources(url, msg):
    with pytest.raises(ImageError, match=msg):
        load_image(url, ImageLimits())


def test_truncated_png():
    with pytest.raises(ImageError, match="cannot decode"):
        load_image(data_url(PNG[: len(PNG) // 2]))


def test_size_limits():
    lim = ImageLimits(max_width=32, max_height=64)
    with pytest.raises(ImageError, match=r"40x30 pixels, beyond this server's limit of 32x64 \(width 40 > 32\)"):
        load_image(data_url(PNG), lim)
    assert load_image(data_url(PNG), ImageLimits(max_width=40, max_height=30)).size == (40, 30)
    with pytest.raises(ImageError, match="larger than the limit of 100 bytes"):
        load_image(data_url(PNG), ImageLimits(max_bytes=100))


def test_local_paths(tmp_path):
    p = tmp_path / "a.png"
    p.write_bytes(PNG)
    with pytest.raises(ImageError, match="local image paths are not allowed"):
        load_image(str(p), ImageLimits())
    assert load_image(str(p), ImageLimits(allowed_local_dirs=[tmp_path])).size == (40, 30)
    assert load_image("file://" + str(p), ImageLimits(allowed_local_dirs=[tmp_path])).size == (40, 30)
    other = tmp_path.parent / "outside.png"
    other.write_bytes(PNG)
    with pytest.raises(ImageError, match="outside the directories"):
        load_image(str(other), ImageLimits(allowed_local_dirs=[tmp_path]))
    with pytest.raises(ImageError, match="no such image file"):
        load_image(str(tmp_path / "nope.png"), ImageLimits(allowed_local_dirs=[tmp_path]))


def test_content_parts():
    assert image_part_url({"type": "image_url", "image_url": {"url": "data:x"}}, "m") == "data:x"
    assert image_part_url({"type": "image_url", "image_url": "http://h/a.png"}, "m") == "http://h/a.png"
    assert image_part_url({"type": "image", "image": "u"}, "m") == "u"
    with pytest.raises(ImageError, match=r"messages\[0\].content\[1\].image_url.url: an image content part needs"):
        image_part_url({"type": "image_url", "image_url": {}}, "messages[0].content[1]")
    with pytest.raises(ImageError, match="detail"):
        image_part_url({"type": "image_url", "image_url": {"url": "u", "detail": "x"}}, "m")
