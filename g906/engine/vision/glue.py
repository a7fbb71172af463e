"""The few lines other engine modules call (kept here so their edits stay one-liners).

    x, rotary = multimodal_step(x, ctx, config, rotary)     # the text model, per forward
    chat_image_urls(part, where)                            # the server, per content part
    ids, mm = await prepare_chat_images(vision, ids, urls)  # the server, per chat request
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

from g906.engine.vision.image import ImageError

IMAGE_PART_TYPES = ("image_url", "image", "input_image")


def multimodal_step(x, ctx, config, rotary):
    """Write the step's image embeddings (ctx.mm_embeds [K, H]) over the embeddings of the tokens
    at ctx.mm_embed_index [K], and switch to this step's M-RoPE table when ctx.mrope_positions
    ([3, T]) is set. Returns (embeddings, rotary to use)."""
    embeds = getattr(ctx, "mm_embeds", None)
    if embeds is not None:
        x = x.index_copy(0, ctx.mm_embed_index, embeds.to(x.dtype))
    if getattr(ctx, "mrope_positions", None) is not None:
        from g906.engine.layers import ops
        from g906.engine.vision.mrope import step_rotary

        rotary = step_rotary(config, ctx.mrope_positions, ops.rotary_)
    return x, rotary


def image_part_url(part: dict, where: str) -> str:
    """The URL of an OpenAI image content part: {"type": "image_url", "image_url": {"url": ...}}
    (a bare string is accepted too), {"type": "image", "image": url} or
    {"type": "input_image", "image_url": url}."""
    kind = part.get("type")
    value = part.get("image_url") if kind in ("image_url", "input_image") else part.get("image")
    if isinstance(value, dict):
        detail = value.get("detail")
        if detail is not None and detail not in ("auto", "low", "high"):
            raise ImageError(f"{where}.image_url.detail: must be auto, low or high")
        value = value.get("url")
    if not isinstance(value, str) or not value.strip():
        field = "image_url.url" if kind != "image" else "image"
        raise ImageError(f"{where}.{field}: an image content part needs a URL string "
                         "(a data: URL with base64, or an http(s) URL)")
    return value


def placeholder_text(vision=None) -> str:
    """The text one image becomes in the prompt: vision_start, one image_pad, vision_end."""
    from g906.engine.vision.runtime import IMAGE_PAD, VISION_END, VISION_START

    return VISION_START + IMAGE_PAD + VISION_END


async def prepare_chat_images(vision, ids: list[int], urls: Sequence[str], *,
                              run: Callable[..., Awaitable[Any]] | None = None) -> tuple[list[int], Any]:
    """Fetch/decode/check/resize a chat request's images and expand the prompt's placeholders.
    Remote images are fetched as coroutines under the fetch policy (fetch.py); decoding and
    resizing run through `run(fn, *args)` (the server's worker pool; default: a thread).
    Raises ImageError (HTTP 400) for a text-only model, too many images, or a bad image."""
    from g906.engine.vision.fetch import fetch_remote, is_remote

    if vision is None:
        raise ImageError("this model does not take images (text only)",
                         hint="serve a multimodal model with multimodal.image set in the recipe")
    vision.check_count(len(urls))
    policy = vision.limits.fetch

    async def source(i: int, url: str):
        what = f"image {i + 1}" if len(urls) > 1 else "image"
        return await fetch_remote(url, policy, what=what) if is_remote(url) else url

    tasks = [asyncio.ensure_future(source(i, u)) for i, u in enumerate(urls)]
    try:
        sources = await asyncio.gather(*tasks)
    finally:   # one failed (or the client left): the other fetches stop too
        for t in tasks:
            t.cancel()
    prepared = await (run or asyncio.to_thread)(vision.prepare_images, list(sources))
    return vision.expand(ids, prepared)
