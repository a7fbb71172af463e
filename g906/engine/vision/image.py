"""Images in: fetch (data: URL, local path, http(s)), decode (Pillow), check the limits, and
preprocess into flattened patches the way the reference processor does (transformers'
Qwen2VLImageProcessor, PIL path, which Qwen3.5 uses):

1. RGB (transparency composited onto white);
2. resize (bicubic, on the 8-bit image) to the nearest multiples of patch x merge whose area lies
   within [min_pixels, max_pixels] (smart_resize), keeping the aspect ratio;
3. x / 255 (float64 -> float32), then (x - mean) / std in float32;
4. patches in merge-block order (block_row, block_col, in_row, in_col), each flattened as
   (channel, temporal, row, col) with the frame repeated over the temporal patch.

Every failure raises ImageError (a G906Error) with a message naming the image; the server maps
it to HTTP 400.
"""

from __future__ import annotations

import base64
import binascii
import io
import math
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from g906.engine.vision.config import VisionConfig
from g906.errors import G906Error

DEFAULT_MAX_IMAGE_BYTES = 20 * 1024 * 1024
DEFAULT_FETCH_TIMEOUT_S = 10.0
# decoding never goes beyond this many pixels, whatever the limits (Pillow's bomb guard is 2x 89M)
HARD_MAX_PIXELS = 16384 * 16384


class ImageError(G906Error):
    """A bad, unreachable or oversized image (HTTP 400)."""


@dataclass
class ImageLimits:
    max_width: int | None = None
    max_height: int | None = None
    max_bytes: int = DEFAULT_MAX_IMAGE_BYTES
    # remote (http/https) images: None refuses them (g906/engine/vision/fetch.py: FetchPolicy)
    fetch: Any = None
    # local files: None refuses them; a list of directories allows files under them; ["/"] all
    allowed_local_dirs: list[Path] | None = None


@dataclass
class PreparedImage:
    """One image ready for the tower."""
    pixel_values: np.ndarray            # float32 [t*gh*gw, patch_dim]
    grid: tuple[int, int, int]          # (t, gh, gw) in patches
    size: tuple[int, int]               # original (width, height)
    resized: tuple[int, int]            # (width, height) after resizing

    def num_tokens(self, merge: int) -> int:
        t, gh, gw = self.grid
        return t * gh * gw // (merge * merge)


# -------------------------------------------------------------------------------------------
# fetching

_DATA_URL = re.compile(r"^data:(?P<mime>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^;,]*)*?)(?P<b64>;base64)?,", re.IGNORECASE)


def _describe(url: str) -> str:
    return url if len(url) <= 80 else url[:60] + "..." + url[-10:]


def fetch_image_bytes(url: str, limits: ImageLimits | None = None, *, what: str = "image") -> bytes:
    """The encoded bytes of an image given as a data: URL, a local path (or file:// URL) or an
    http(s) URL."""
    lim = limits or ImageLimits()
    if not isinstance(url, str) or not url.strip():
        raise ImageError(f"{what}: the image URL is empty")
    url = url.strip()
    if url[:5].lower() == "data:":
        return _data_url_bytes(url, lim, what)
    low = url.lower()
    if low.startswith(("http://", "https://")):
        if lim.fetch is None:
            raise ImageError(f"{what}: fetching images over http(s) is turned off on this server",
                             hint="send the image inline as a data: URL (base64); an operator can allow image "
                             "hosts with multimodal.image_fetch.allowed_hosts in the recipe")
        return lim.fetch.fetch_sync(url, what=what)
    if low.startswith("file://"):
        path = url[7:]
    elif re.match(r"^[a-z][a-z0-9+.-]*://", low):
        raise ImageError(f"{what}: unsupported URL scheme in {_describe(url)!r}",
                         hint="use a data: URL (base64), an http(s) URL or a local path")
    else:
        path = url
    return _file_bytes(Path(path).expanduser(), lim, what)


def _data_url_bytes(url: str, lim: ImageLimits, what: str) -> bytes:
    m = _DATA_URL.match(url)
    if m is None:
        raise ImageError(f"{what}: malformed data: URL (expected data:<mime>;base64,<data>)")
    mime = (m.group("mime") or "").lower()
    if mime and not mime.startswith("image/") and mime != "application/octet-stream":
        raise ImageError(f"{what}: the data: URL holds {mime!r}, not an image")
    payload = url[m.end():]
    if not m.group("b64"):
        raise ImageError(f"{what}: only base64 data: URLs are supported (data:image/png;base64,...)")
    if len(payload) * 3 // 4 > lim.max_bytes + 3:
        raise ImageError(f"{what}: the image is larger than the limit of {lim.max_bytes} bytes")
    try:
        data = base64.b64decode(re.sub(r"\s+", "", payload), validate=True)
    except (binascii.Error, ValueError) as exc:
        raise ImageError(f"{what}: the data: URL is not valid base64: {exc}") from None
    if not data:
        raise ImageError(f"{what}: the data: URL is empty")
    return data


def _file_bytes(p: Path, lim: ImageLimits, what: str) -> bytes:
    if lim.allowed_local_dirs is None:
        raise ImageError(f"{what}: local image paths are not allowed here",
                         hint="send the image as a data: URL (base64) or an http(s) URL; servers allow "
                         "local files under G906_ALLOWED_LOCAL_MEDIA_PATH")
    try:
        real = p.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ImageError(f"{what}: no such image file: {p}") from None
    if not any(real == d or d in real.parents for d in (Path(x).resolve() for x in lim.allowed_local_dirs)):
        raise ImageError(f"{what}: {p} is outside the directories images may be read from",
                         hint="G906_ALLOWED_LOCAL_MEDIA_PATH lists them")
    if not real.is_file():
        raise ImageError(f"{what}: {p} is not a file")
    size = real.stat().st_size
    if size > lim.max_bytes:
        raise ImageError(f"{what}: {p} has {size} bytes, more than the limit of {lim.max_bytes}")
    try:
        return real.read_bytes()
    except OSError as exc:
        raise ImageError(f"{what}: cannot read {p}: {exc.strerror or exc}") from None


# -------------------------------------------------------------------------------------------
# decoding


def decode_image(data: bytes, limits: ImageLimits | None = None, *, what: str = "image"):
    """Encoded bytes -> an RGB PIL image (transparency on white), with the size limits checked
    before the pixels are decoded."""
    from PIL import Image, UnidentifiedImageError

    lim = limits or ImageLimits()
    try:
        img = Image.open(io.BytesIO(data))
    except UnidentifiedImageError:
        raise ImageError(f"{what}: not an image Pillow can read (PNG, JPEG, WebP, GIF, BMP ...)") from None
    except (OSError, ValueError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{what}: cannot decode the image: {exc}") from None
    w, h = img.size
    check_image_size(w, h, lim, what)
    try:
        img.load()
        return to_rgb(img)
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError) as exc:
        raise ImageError(f"{what}: cannot decode the image: {exc}") from None


def check_image_size(w: int, h: int, lim: ImageLimits, what: str = "image") -> None:
    if w < 1 or h < 1:
        raise ImageError(f"{what}: the image is empty ({w}x{h})")
    if w * h > HARD_MAX_PIXELS:
        raise ImageError(f"{what}: the image is {w}x{h} pixels, too large to decode")
    over = []
    if lim.max_width is not None and w > lim.max_width:
        over.append(f"width {w} > {lim.max_width}")
    if lim.max_height is not None and h > lim.max_height:
        over.append(f"height {h} > {lim.max_height}")
    if over:
        raise ImageError(f"{what}: the image is {w}x{h} pixels, beyond this server's limit of "
                         f"{lim.max_width or '-'}x{lim.max_height or '-'} ({', '.join(over)})",
                         hint="send a smaller image (the recipe's multimodal.image width/height set the limit)")


def to_rgb(img):
    from PIL import Image

    if "A" in img.getbands() or img.info.get("transparency") is not None:
        rgba = img.convert("RGBA")
        bg = Image.new("RGBA", rgba.size, (255, 255, 255, 255))
        return Image.alpha_composite(bg, rgba).convert("RGB")
    return img.convert("RGB")


def load_image(url_or_image: Any, limits: ImageLimits | None = None, *, what: str = "image"):
    """A PIL image from a URL/path string, raw bytes, a PIL image or an HxWx3 uint8 array."""
    lim = limits or ImageLimits()
    if isinstance(url_or_image, (bytes, bytearray, memoryview)):
        if len(url_or_image) > lim.max_bytes:
            raise ImageError(f"{what}: the image is larger than the limit of {lim.max_bytes} bytes")
        return decode_image(bytes(url_or_image), lim, what=what)
    if isinstance(url_or_image, (str, os.PathLike)):
        return decode_image(fetch_image_bytes(os.fspath(url_or_image), lim, what=what), lim, what=what)
    try:
        from PIL import Image
    except ImportError:  # pragma: no cover
        Image = None
    if Image is not None and isinstance(url_or_image, Image.Image):
        check_image_size(*url_or_image.size, lim, what)
        return to_rgb(url_or_image)
    if isinstance(url_or_image, np.ndarray):
        a = url_or_image
        if a.ndim != 3 or a.shape[2] not in (3, 4) or a.dtype != np.uint8:
            raise ImageError(f"{what}: arrays must be HxWx3 (or 4) uint8, got {a.shape} {a.dtype}")
        check_image_size(a.shape[1], a.shape[0], lim, what)
        return to_rgb(Image.fromarray(a))
    raise ImageError(f"{what}: cannot use a {type(url_or_image).__name__} as an image",
                     hint="pass a data: URL, a path, bytes, a PIL image or an HxWx3 uint8 array")


# -------------------------------------------------------------------------------------------
# preprocessing


def smart_resize(height: int, width: int, factor: int, min_pixels: int, max_pixels: int) -> tuple[int, int]:
    """(height, width): multiples of factor, area within [min_pixels, max_pixels], aspect kept."""
    if max(height, width) / min(height, width) > 200:
        raise ImageError(f"image: aspect ratio {max(height, width) / min(height, width):.0f}:1 is beyond 200:1")
    h = round(height / factor) * factor
    w = round(width / factor) * factor
    if h * w > max_pixels:
        beta = math.sqrt(height * width / max_pixels)
        h = max(factor, math.floor(height / beta / factor) * factor)
        w = max(factor, math.floor(width / beta / factor) * factor)
    elif h * w < min_pixels:
        beta = math.sqrt(min_pixels / (height * width))
        h = math.ceil(height * beta / factor) * factor
        w = math.ceil(width * beta / factor) * factor
    return h, w


def resized_size(cfg: VisionConfig, width: int, height: int) -> tuple[int, int]:
    """(width, height) an image of this size is resized to."""
    h, w = smart_resize(height, width, cfg.factor, cfg.min_pixels, cfg.max_pixels)
    return w, h


def preprocess(img, cfg: VisionConfig) -> PreparedImage:
    """An RGB PIL image -> PreparedImage (see the module docstring for the steps)."""
    from PIL import Image

    width, height = img.size
    w, h = resized_size(cfg, width, height)
    if img.mode != "RGB":
        img = to_rgb(img)
    resized = img.resize((w, h), resample=Image.Resampling.BICUBIC)
    arr = np.asarray(resized, dtype=np.uint8)                # H, W, 3
    x = (arr.astype(np.float64) * (1 / 255)).astype(np.float32)
    mean = np.asarray(cfg.image_mean, dtype=np.float32)
    std = np.asarray(cfg.image_std, dtype=np.float32)
    x = ((x - mean) / std).astype(np.float32)
    x = np.ascontiguousarray(x.transpose(2, 0, 1))           # C, H, W
    p, m, tp = cfg.patch_size, cfg.spatial_merge_size, cfg.temporal_patch_size
    c = x.shape[0]
    gh, gw = h // p, w // p
    x = x.reshape(c, gh // m, m, p, gw // m, m, p).transpose(1, 4, 2, 5, 0, 3, 6)
    x = np.broadcast_to(x[:, :, :, :, :, None], (*x.shape[:5], tp, p, p))
    patches = np.ascontiguousarray(x.reshape(gh * gw, c * tp * p * p), dtype=np.float32)
    return PreparedImage(patches, (1, gh, gw), (width, height), (w, h))


def prepare_image(src: Any, cfg: VisionConfig, limits: ImageLimits | None = None, *, what: str = "image") -> PreparedImage:
    """fetch + decode + check + preprocess."""
    return preprocess(load_image(src, limits, what=what), cfg)


def allowed_local_dirs_from_env() -> list[Path] | None:
    """G906_ALLOWED_LOCAL_MEDIA_PATH: directories (os.pathsep-separated) a server may read images from."""
    raw = os.environ.get("G906_ALLOWED_LOCAL_MEDIA_PATH", "").strip()
    if not raw:
        return None
    return [Path(x).expanduser() for x in raw.split(os.pathsep) if x.strip()]
