"""load_vision from an HF directory and from a main GGUF + mmproj GGUF; mmproj files that are
wrong in every way the converter's conventions allow get a message naming the file and what."""

from __future__ import annotations

import pytest
import torch

from g906.arch import config_from_hf_dir
from g906.engine.loaders.gguf import GGUFModelFile
from g906.engine.tokenizer import Tokenizer
from g906.engine.vision.runtime import load_vision
from g906.engine.vision.weights import MmprojFile
from g906.errors import G906Error
from tests.multimodal.mmproj_writer import write_mmproj


def test_hf_dir(vl_hf_dir, vl_token_ids):
    cfg = config_from_hf_dir(vl_hf_dir)
    v = load_vision(vl_hf_dir, text_config=cfg, tokenizer=Tokenizer.from_hf_dir(vl_hf_dir))
    assert v.token_ids.image == vl_token_ids["<|image_pad|>"]
    assert v.token_ids.vision_start == vl_token_ids["<|vision_start|>"]
    assert v.config.min_pixels == 64 * 64
    assert v.info["vision_weight_bytes"] > 0


def test_gguf_ids_from_tokenizer(vl_gguf_dir, vl_token_ids):
    main = GGUFModelFile(vl_gguf_dir / "tiny-vl-F32.gguf")
    cfg = main.config()
    assert cfg.image_token_id is None          # GGUF metadata carries no vision token ids
    v = load_vision(main.path, mmproj=vl_gguf_dir / "mmproj-tiny-vl-F32.gguf", text_config=cfg,
                    tokenizer=main.tokenizer())
    assert v.token_ids.image == vl_token_ids["<|image_pad|>"]
    assert v.token_ids.vision_end == vl_token_ids["<|vision_end|>"]


def test_text_only_model(tmp_path, vl_gguf_dir):
    main = vl_gguf_dir / "tiny-vl-F32.gguf"
    assert load_vision(main) is None
    with pytest.raises(G906Error, match="has no vision tower"):
        load_vision(main, required=True)


def test_hidden_size_mismatch(vl_gguf_dir):
    cfg = GGUFModelFile(vl_gguf_dir / "tiny-vl-F32.gguf").config()
    cfg.hidden_size = 128
    with pytest.raises(G906Error, match="outputs 64 features but the text model's hidden size is 128"):
        load_vision(vl_gguf_dir / "tiny-vl-F32.gguf", mmproj=vl_gguf_dir / "mmproj-tiny-vl-F32.gguf", text_config=cfg)


@pytest.mark.parametrize("kw,msg", [
    (dict(projector_type="qwen2vl_merger"), "projector type 'qwen2vl_merger' is not 'qwen3vl_merger'"),
    (dict(metadata_overrides={"clip.vision.block_count": None}), "lacks clip.vision.block_count"),
    (dict(metadata_overrides={"clip.vision.block_count": 3}), "vision tensor blocks.2.norm1.weight is missing"),
    (dict(metadata_overrides={"clip.vision.is_deepstack_layers": [True, False]}), "deepstack"),
    (dict(drop_tensors=("mm.2.weight",)), "merger.linear_fc2.weight is missing"),
    (dict(drop_tensors=("v.patch_embd.weight",)), "v.patch_embd.weight is missing"),
    (dict(metadata_overrides={"clip.vision.embedding_length": 48}), "has shape"),
])
def test_bad_mmproj(vl_hf_dir, tmp_path, kw, msg):
    p = write_mmproj(vl_hf_dir, tmp_path / "mmproj-bad.gguf", **kw)
    with pytest.raises(G906Error, match=msg) as exc:
        load_vision("unused", mmproj=p, text_config=config_from_hf_dir(vl_hf_dir))
    assert "mmproj-bad.gguf" in exc.value.message


def test_not_a_projector(vl_gguf_dir):
    with pytest.raises(G906Error, match="not a vision projector"):
        MmprojFile(vl_gguf_dir / "tiny-vl-F32.gguf").config()


def test_truncated_mmproj(vl_gguf_dir, tmp_path):
    src = (vl_gguf_dir / "mmproj-tiny-vl-F32.gguf").read_bytes()
    p = tmp_path / "mmproj-cut.gguf"
    p.write_bytes(src[: len(src) - 1000])
    with pytest.raises(G906Error, match="truncated"):
        load_vision("unused", mmproj=p)


def test_fp16_load(vl_hf_dir):
    v = load_vision(vl_hf_dir, text_config=config_from_hf_dir(vl_hf_dir), dtype=torch.float16)
    assert v.tower.merger.linear_fc2.weight.dtype == torch.float16


def test_is_mmproj(vl_gguf_dir, tmp_path):
    from g906.engine.vision.weights import is_mmproj

    mmproj = vl_gguf_dir / "mmproj-tiny-vl-F32.gguf"
    assert is_mmproj(mmproj)
    assert not is_mmproj(vl_gguf_dir / "tiny-vl-F32.gguf")          # the language model
    cut = tmp_path / "mmproj-cut.gguf"
    cut.write_bytes(mmproj.read_bytes()[:100])
    assert not is_mmproj(cut) and not is_mmproj(tmp_path / "absent.gguf")
