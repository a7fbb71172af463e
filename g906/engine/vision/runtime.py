"""The vision side of a served model: tower + config + token ids + limits, and the steps a
request with images goes through.

    vision = load_vision(source, mmproj=mmproj_path, text_config=cfg, tokenizer=tok,
                         dtype=model_dtype, device=model_device)       # None: text-only model
    vision.configure_limits(count=4, width=1920, height=1080)          # per request (g906.serving
                                                                       # sets the recipe's)
    prepared = vision.prepare_images(urls, limits)     # fetch/decode/check/resize (CPU; 400s)
    ids, mm = vision.expand(ids, prepared)             # image_pad x n, M-RoPE positions
    vision.encode(mm)                                  # embeddings, once (engine thread)
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from g906.engine.vision.config import VisionConfig
from g906.engine.vision.image import (
    ImageError,
    ImageLimits,
    PreparedImage,
    prepare_image,
    resized_size,
)
from g906.engine.vision.inputs import MultimodalInputs, VisionTokenIds, expand_prompt
from g906.engine.vision.tower import VisionTower
from g906.errors import G906Error

log = logging.getLogger("g906.engine")

IMAGE_PAD = "<|image_pad|>"
VISION_START = "<|vision_start|>"
VISION_END = "<|vision_end|>"


class VisionRuntime:
    def __init__(self, tower: VisionTower, token_ids: VisionTokenIds, *, source: str = "", info: dict | None = None):
        self.tower = tower
        self.config: VisionConfig = tower.config
        self.token_ids = token_ids
        self.source = source
        self.info = dict(info or {})
        self.max_images: int | None = None
        self.limits = ImageLimits()

    # -- limits ---------------------------------------------------------------------------------
    def configure_limits(self, *, count: int | None, width: int | None, height: int | None,
                         **limit_kw: Any) -> None:
        """Per-request limits (the recipe's multimodal.image: count, width, height)."""
        self.max_images = count
        self.limits = ImageLimits(max_width=width, max_height=height, **limit_kw)

    def tokens_for_size(self, width: int, height: int) -> int:
        """Image tokens an image of this size becomes."""
        w, h = resized_size(self.config, width, height)
        p = self.config.patch_size
        return (h // p) * (w // p) // self.config.merge_unit

    # -- a request ------------------------------------------------------------------------------
    def check_count(self, n: int) -> None:
        if self.max_images is not None and n > self.max_images:
            raise ImageError(f"the request has {n} images; this server takes at most {self.max_images} per request",
                             hint="send fewer images (the recipe's multimodal.image count sets the limit)")

    def prepare_images(self, sources: Sequence[Any], limits: ImageLimits | None = None) -> list[PreparedImage]:
        self.check_count(len(sources))
        lim = limits or self.limits
        return [prepare_image(s, self.config, lim, what=f"image {i + 1}" if len(sources) > 1 else "image")
                for i, s in enumerate(sources)]

    def expand(self, ids: Sequence[int], images: list[PreparedImage]) -> tuple[list[int], MultimodalInputs]:
        return expand_prompt(ids, images, self.token_ids, self.config.spatial_merge_size)

    @torch.inference_mode()
    def encode(self, mm: MultimodalInputs) -> MultimodalInputs:
        """Run the tower once for all images of the request (no-op when already encoded)."""
        if mm.embeds is not None:
            return mm
        import numpy as np

        pv = torch.from_numpy(np.concatenate([im.pixel_values for im in mm.images], 0))
        emb = self.tower(pv, [im.grid for im in mm.images])
        if emb.shape[0] != mm.num_image_tokens:
            raise G906Error(f"internal error: {emb.shape[0]} image embeddings for {mm.num_image_tokens} image tokens")
        mm.embeds = emb
        return mm

    def describe(self) -> dict:
        return {"source": self.source, "config": self.config.to_json(), "max_images": self.max_images,
                "max_width": self.limits.max_width, "max_height": self.limits.max_height, **self.info}

    # -- profiling --------------------------------------------------------------------------------
    def profile(self, width: int, height: int, count: int = 1) -> int:
        """Run the tower on `count` blank images of width x height (the largest a request may
        send) and return the activation peak in bytes (GPU; 0 on CPU)."""
        import numpy as np
        from PIL import Image

        img = Image.new("RGB", (int(width), int(height)), (127, 127, 127))
        prepared = [prepare_image(img, self.config, ImageLimits()) for _ in range(max(1, int(count)))]
        mm = MultimodalInputs(images=prepared, pad_index=np.zeros(0, np.int64), positions=np.zeros((3, 0), np.int64),
                              delta=0, prompt_len=0)
        dev = self.tower.device
        if dev.type != "cuda":
            return 0
        torch.cuda.synchronize(dev)
        base = torch.cuda.memory_allocated(dev)
        torch.cuda.reset_peak_memory_stats(dev)
        pv = torch.from_numpy(np.concatenate([im.pixel_values for im in mm.images], 0))
        out = self.tower(pv, [im.grid for im in mm.images])
        torch.cuda.synchronize(dev)
        peak = torch.cuda.max_memory_allocated(dev) - base
        del out
        torch.cuda.empty_cache()
        return int(peak)


def vision_token_ids(text_config, tokenizer) -> VisionTokenIds | None:
    """The image / vision start / end token ids, from the model config or the tokenizer."""
    img = getattr(text_config, "image_token_id", None)
    start = getattr(text_config, "vision_start_token_id", None)
    end = getattr(text_config, "vision_end_token_id", None)
    if tokenizer is not None:
        look = getattr(tokenizer, "token_to_id", None)
        if callable(look):
            img = img if img is not None else look(IMAGE_PAD)
            start = start if start is not None else look(VISION_START)
            end = end if end is not None else look(VISION_END)
    if img is None:
        return None
    return VisionTokenIds(int(img), None if start is None else int(start), None if end is None else int(end))


def open_vision_source(source: str | Path, mmproj: str | Path | None):
    """(VisionConfig, weights iterator factory, description) or None when there is no vision tower."""
    if mmproj is not None:
        from g906.engine.vision.weights import MmprojFile

        f = MmprojFile(mmproj)
        return f.config(), f.weights, f"mmproj {Path(mmproj).name}"
    p = Path(str(source)).expanduser()
    if p.is_file() and p.name == "config.json":
        p = p.parent
    if p.is_dir() and (p / "config.json").is_file():
        import json

        try:
            cfg = json.loads((p / "config.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            cfg = {}
        if not isinstance(cfg, dict) or not isinstance(cfg.get("vision_config"), dict):
            return None
        from g906.engine.vision.weights import hf_vision_weights

        vc = VisionConfig.from_hf_dir(p)
        return vc, (lambda: hf_vision_weights(p)), f"{p.name} (model.visual.*)"
    return None


def load_vision(source: str | Path, *, mmproj: str | Path | None = None, text_config=None, tokenizer=None,
                dtype: torch.dtype = torch.float32, device=None, required: bool = False) -> VisionRuntime | None:
    """The vision runtime for a model: from the mmproj GGUF when given, else from an HF
    directory's vision tower. None when the model has none (an error when required)."""
    opened = open_vision_source(source, mmproj)
    if opened is None:
        if required:
            raise G906Error(f"{source}: the model has no vision tower",
                            hint="for GGUF models, put the mmproj-*.gguf beside the model (or name it in "
                            "model.mmproj); for HF checkpoints use a multimodal (vision_config) one")
        return None
    vc, weights, desc = opened
    if text_config is not None and vc.out_hidden_size != text_config.hidden_size:
        raise G906Error(f"{desc}: the projector outputs {vc.out_hidden_size} features but the text model's "
                        f"hidden size is {text_config.hidden_size}",
                        hint="the mmproj file belongs to a different model; use the one from the same release")
    tok = vision_token_ids(text_config, tokenizer)
    if tok is None:
        raise G906Error(f"{source}: cannot find the image token ({IMAGE_PAD}) in the model config or tokenizer",
                        hint="the tokenizer must be Qwen3.5's (with its vision tokens)")
    if text_config is not None and not 0 <= tok.image < text_config.vocab_size:
        raise G906Error(f"{source}: image token id {tok.image} is outside the vocabulary")
    t0 = time.perf_counter()
    tower = VisionTower(vc, dtype=dtype, device=device)
    nbytes = tower.load_weights(weights(), source=desc)
    info = {"vision_weight_bytes": nbytes, "vision_load_seconds": round(time.perf_counter() - t0, 3)}
    log.info("vision tower loaded from %s: %d blocks, %.1f MiB", desc, vc.depth, nbytes / 2**20)
    return VisionRuntime(tower, tok, source=desc, info=info)


def profile_size(vision: VisionRuntime) -> tuple[int, int]:
    """The largest image a request may send: the recipe's width x height, else the square the
    processor's max_pixels allows."""
    lim = vision.limits
    if lim.max_width and lim.max_height:
        return lim.max_width, lim.max_height
    side = int(vision.config.max_pixels ** 0.5)
    w = lim.max_width or side
    h = lim.max_height or side
    return w, h


class reserve_vision_memory:
    """with reserve_vision_memory(vision): engine = LLMEngine(...)

    On a GPU: runs the tower on `count` images of the largest allowed size and holds a buffer of
    its activation peak while the engine profiles and sizes its KV cache (so the cache leaves
    that room free), then releases it. Nothing on the CPU."""

    def __init__(self, vision: VisionRuntime | None):
        self.vision = vision
        self.peak = 0
        self._hold = None

    def __enter__(self) -> reserve_vision_memory:
        v = self.vision
        if v is None or v.tower.device.type != "cuda":
            return self
        w, h = profile_size(v)
        count = v.max_images or 1
        t0 = time.perf_counter()
        self.peak = v.profile(w, h, count)
        v.info.update({"vision_profile": {"width": w, "height": h, "count": count, "peak_bytes": self.peak,
                                          "seconds": round(time.perf_counter() - t0, 3)}})
        self._hold = torch.empty(self.peak, dtype=torch.uint8, device=v.tower.device)
        log.info("vision: %d image(s) of %dx%d peak at %.1f MiB, kept free for them", count, w, h, self.peak / 2**20)
        return self

    def __exit__(self, *exc) -> None:
        self._hold = None
        if self.vision is not None and self.vision.tower.device.type == "cuda":
            torch.cuda.empty_cache()
