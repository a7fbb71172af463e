"""Multimodal fixtures (session-scoped, all tiny, CPU fp32):

  vl_tokenizer_dir   a Qwen-like BPE tokenizer (tests/engine/qwen_tokenizer.py) plus Qwen's vision
                     tokens <|vision_start|> <|vision_end|> <|image_pad|> <|video_pad|> (special)
  vl_hf_model        transformers Qwen3_5ForConditionalGeneration: the tiny text model of
                     tests/engine/conftest.py and a 2-block vision tower (hidden 32, 2 heads,
                     patch 16, temporal 2, merge 2, a 4x4 learned position grid), random weights
  vl_hf_dir          its save_pretrained directory + tokenizer + preprocessor_config.json
  vl_gguf_dir        a directory with tiny-vl-F32.gguf (tests/engine/gguf_writer) and
                     mmproj-tiny-vl-F32.gguf (tests/multimodal/mmproj_writer), as llama.cpp writes them
"""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch

from tests.engine.conftest import (  # noqa: F401
    randomise_qwen35,
    tiny_text_config_kwargs,
    torch_one_thread,
)

VISION_TOKENS = ["<|vision_start|>", "<|vision_end|>", "<|image_pad|>", "<|video_pad|>"]
MIN_PIXELS = 64 * 64
MAX_PIXELS = 256 * 256
PREPROCESSOR = {
    "image_processor_type": "Qwen2VLImageProcessor",
    "patch_size": 16, "temporal_patch_size": 2, "merge_size": 2,
    "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5],
    "size": {"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
}
VISION_CONFIG = dict(
    depth=2, hidden_size=32, intermediate_size=64, num_heads=2, out_hidden_size=64,
    patch_size=16, spatial_merge_size=2, temporal_patch_size=2, num_position_embeddings=16,
)


def png_bytes(width: int, height: int, seed: int = 0, mode: str = "RGB") -> bytes:
    from PIL import Image

    rng = np.random.default_rng(seed)
    arr = rng.integers(0, 256, (height, width, 4 if mode == "RGBA" else 3), dtype=np.uint8)
    img = Image.fromarray(arr, "RGBA" if mode == "RGBA" else "RGB")
    if mode not in ("RGB", "RGBA"):
        img = img.convert(mode)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def data_url(data: bytes, mime: str = "image/png") -> str:
    import base64

    return f"data:{mime};base64," + base64.b64encode(data).decode()


@pytest.fixture(scope="session")
def vl_tokenizer_dir(tmp_path_factory):
    from tokenizers import AddedToken
    from transformers import PreTrainedTokenizerFast

    from tests.engine.qwen_tokenizer import CHAT_TEMPLATE, train_backend

    d = tmp_path_factory.mktemp("vl-tokenizer")
    backend = train_backend("qwen35")
    backend.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in VISION_TOKENS])
    tok = PreTrainedTokenizerFast(tokenizer_object=backend, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token=None, bos_token=None)
    tok.chat_template = CHAT_TEMPLATE
    tok.save_pretrained(str(d))
    return d


@pytest.fixture(scope="session")
def vl_token_ids(vl_tokenizer_dir) -> dict[str, int]:
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(vl_tokenizer_dir))
    ids = {t: tok.convert_tokens_to_ids(t) for t in VISION_TOKENS}
    assert max(ids.values()) < 512
    return ids


@torch.no_grad()
def randomise_vision(visual, seed: int = 3) -> None:
    g = torch.Generator().manual_seed(seed)
    for name, p in visual.named_parameters():
        if "norm" in name and name.endswith("weight"):
            p.copy_(1.0 + 0.3 * torch.randn(p.shape, generator=g))
        elif name.endswith("bias"):
            p.copy_(0.1 * torch.randn(p.shape, generator=g))
        elif "pos_embed" in name:
            p.copy_(torch.randn(p.shape, generator=g))
        elif p.dim() >= 2:
            fan_in = math.prod(p.shape[1:])
            p.copy_(torch.randn(p.shape, generator=g) / math.sqrt(fan_in))


def build_vl_model(token_ids: dict[str, int], seed: int = 0):
    from transformers import Qwen3_5Config, Qwen3_5ForConditionalGeneration

    cfg = Qwen3_5Config(
        text_config=tiny_text_config_kwargs(),
        vision_config=dict(VISION_CONFIG),
        image_token_id=token_ids["<|image_pad|>"],
        video_token_id=token_ids["<|video_pad|>"],
        vision_start_token_id=token_ids["<|vision_start|>"],
        vision_end_token_id=token_ids["<|vision_end|>"],
        tie_word_embeddings=False,
    )
    torch.manual_seed(seed)
    model = Qwen3_5ForConditionalGeneration(cfg).eval().to(torch.float32)
    randomise_qwen35(model.model.language_model, seed)
    with torch.no_grad():
        g = torch.Generator().manual_seed(seed + 1)
        model.lm_head.weight.copy_(torch.randn(model.lm_head.weight.shape, generator=g) / 8.0)
    randomise_vision(model.model.visual, seed + 3)
    return model


@pytest.fixture(scope="session")
def vl_hf_model(vl_token_ids):
    return build_vl_model(vl_token_ids)


@pytest.fixture(scope="session")
def vl_hf_dir(vl_hf_model, vl_tokenizer_dir, tmp_path_factory):
    import shutil

    d = tmp_path_factory.mktemp("tiny-qwen35-vl")
    vl_hf_model.save_pretrained(d)
    for f in vl_tokenizer_dir.iterdir():
        shutil.copy(f, d / f.name)
    (d / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    return d


@pytest.fixture(scope="session")
def vl_gguf_dir(vl_hf_dir, vl_tokenizer_dir, tmp_path_factory):
    from tests.engine.gguf_writer import write_gguf
    from tests.multimodal.mmproj_writer import write_mmproj

    d = tmp_path_factory.mktemp("tiny-qwen35-vl-gguf")
    write_gguf(vl_hf_dir, d / "tiny-vl-F32.gguf", tokenizer_dir=vl_tokenizer_dir)
    write_mmproj(vl_hf_dir, d / "mmproj-tiny-vl-F32.gguf")
    return d


@pytest.fixture(scope="session")
def hf_processor():
    """transformers' slow (PIL/numpy) Qwen2-VL image processor with the tiny model's settings."""
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import (
        Qwen2VLImageProcessorPil,
    )

    return Qwen2VLImageProcessorPil(
        patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3, image_std=[0.5] * 3,
        size={"shortest_edge": MIN_PIXELS, "longest_edge": MAX_PIXELS},
    )
