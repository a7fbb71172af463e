"""Prefix caching with images: an image's placeholder tokens are keyed by the image's content, so
a follow-up turn on the same image resumes after it, a different image of the same size (the
same placeholder ids) does not, and greedy outputs equal those with the cache off."""

from __future__ import annotations

import io

import pytest

from g906.engine.llm_engine import EngineConfig, LLMEngine
from g906.engine.sampling_params import SamplingParams
from tests.engine.prefix_workloads import assert_no_leaks
from tests.multimodal.conftest import png_bytes


@pytest.fixture(scope="module")
def vl(vl_gguf_dir):
    from g906.engine.loader import load_model
    from g906.engine.vision.runtime import load_vision

    main = vl_gguf_dir / "tiny-vl-F32.gguf"
    loaded = load_model(str(main), dtype="float32", device="cpu", progress=False)
    vision = load_vision(main, mmproj=vl_gguf_dir / "mmproj-tiny-vl-F32.gguf", text_config=loaded.config,
                         tokenizer=loaded.tokenizer)
    vision.config.min_pixels, vision.config.max_pixels = 64 * 64, 256 * 256
    return loaded, vision


def _image(seed):
    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(120, 90, seed=seed)))


def _run(vl, on: bool, tok: dict[str, int]):
    loaded, vision = vl
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=4, max_num_batched_tokens=16, max_model_len=256,
                                         num_kv_blocks=64, block_size=4, enable_prefix_caching=on,
                                         num_prefix_snapshots=8), vision=vision)
    img = [tok["<|vision_start|>"], tok["<|image_pad|>"], tok["<|vision_end|>"]]
    head = [5, 17, 33] + img + [40, 41, 42, 43, 9]
    turns = [("a", head, 0), ("a-next", head + [60, 61, 62, 63, 64, 65], 0), ("b", head + [60, 61], 1)]
    p = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    out, cached = {}, {}
    for rid, ids, seed in turns:
        ids, mm = vision.expand(ids, vision.prepare_images([_image(seed)]))
        eng.add_request(rid, ids, p, mm=mm)
        while eng.has_unfinished_requests():
            for o in eng.step():
                out.setdefault(o.request_id, []).extend(o.new_token_ids)
                cached[o.request_id] = o.num_cached_tokens
    return out, cached, eng, mm


def test_images_are_keyed_by_content(vl, vl_token_ids):
    want, _, _, _ = _run(vl, False, vl_token_ids)
    got, cached, eng, mm = _run(vl, True, vl_token_ids)
    assert got == want
    start, a_len = mm.spans[0][0], mm.prompt_len - 2      # "b" is "a"'s prompt and two tokens
    assert cached["a-next"] == a_len // 4 * 4 > start        # "a"'s end, past the image
    assert cached["b"] <= start                  # another image: only the text before it
    assert_no_leaks(eng)
