"""The full model with one image against transformers' Qwen3_5ForConditionalGeneration (fp32):
last-position logits (rel err < 1e-4) loaded from the HF directory and from main GGUF + mmproj
GGUF, in one prefill and in chunks that cut the image span; then the engine end to end (greedy
tokens equal transformers', with chunked prefill and a text request in the same batches)."""

from __future__ import annotations

import io

import pytest
import torch

from g906.engine.loader import load_model
from g906.engine.vision.inputs import step_inputs
from g906.engine.vision.runtime import load_vision
from tests.engine.conftest import TinyRunner, rel_err
from tests.multimodal.conftest import png_bytes

pytestmark = pytest.mark.usefixtures("torch_one_thread")


def _image(w=150, h=100, seed=0):
    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(w, h, seed=seed)))


def _prompt(tok: dict[str, int]) -> list[int]:
    return [5, 17, 33, tok["<|vision_start|>"], tok["<|image_pad|>"], tok["<|vision_end|>"], 40, 41, 42, 43, 9]


@pytest.fixture(scope="module", params=["hf", "gguf"])
def g906_model(request, vl_hf_dir, vl_gguf_dir):
    if request.param == "hf":
        loaded = load_model(str(vl_hf_dir), dtype="float32", device="cpu", progress=False)
        vision = load_vision(vl_hf_dir, text_config=loaded.config, tokenizer=loaded.tokenizer)
    else:
        main = vl_gguf_dir / "tiny-vl-F32.gguf"
        loaded = load_model(str(main), dtype="float32", device="cpu", progress=False)
        vision = load_vision(main, mmproj=vl_gguf_dir / "mmproj-tiny-vl-F32.gguf", text_config=loaded.config,
                             tokenizer=loaded.tokenizer)
        # the GGUF has no preprocessor config: preprocess as the checkpoint does
        vision.config.min_pixels, vision.config.max_pixels = 64 * 64, 256 * 256
    return loaded, vision


@torch.no_grad()
def _hf_logits(model, processor, ids, images):
    feats = processor(images=images, return_tensors="pt")
    inp = torch.tensor([ids])
    out = model(input_ids=inp, pixel_values=feats["pixel_values"], image_grid_thw=feats["image_grid_thw"],
                mm_token_type_ids=(inp == model.config.image_token_id).int(), use_cache=False)
    return out.logits[0].float()


class _Seq:
    def __init__(self, mm):
        self.mm = mm
        self.num_cached_tokens = 0


def _g906_logits(model, ids, mm, chunks):
    runner = TinyRunner(model, max_seqs=1, max_len=128)
    seq = _Seq(mm)
    out, start = [], 0
    for n in chunks:
        ctx, positions, seq_lens = runner._ctx([0], [n], True)
        pos = positions.numpy().copy()
        seq.num_cached_tokens = start
        ctx.mrope_positions, ctx.mm_embed_index, ctx.mm_embeds = step_inputs([seq], [n], pos, "cpu", model.dtype)
        hidden = model(torch.tensor(ids[start:start + n]), torch.from_numpy(pos), ctx)
        out.append(model.compute_logits(hidden))
        runner.lens[0] = seq_lens[0]
        start += n
    return torch.cat(out)


@pytest.mark.parametrize("chunks", ["one", "cut"])
def test_logits_match_transformers(g906_model, vl_hf_model, hf_processor, vl_token_ids, chunks):
    loaded, vision = g906_model
    img = _image()
    prepared = vision.prepare_images([img])
    ids, mm = vision.expand(_prompt(vl_token_ids), prepared)
    vision.encode(mm)
    ref = _hf_logits(vl_hf_model, hf_processor, ids, [img])
    # the image embeddings themselves
    feats = hf_processor(images=[img], return_tensors="pt")
    with torch.no_grad():
        ref_emb = vl_hf_model.model.get_image_features(feats["pixel_values"], feats["image_grid_thw"]).pooler_output[0]
    assert rel_err(mm.embeds, ref_emb) < 1e-4
    L = len(ids)
    plan = [L] if chunks == "one" else [5, 9, L - 14]       # the second chunk starts inside the image
    mine = _g906_logits(loaded.model, ids, mm, plan)
    assert rel_err(mine[-1], ref[-1]) < 1e-4
    assert rel_err(mine, ref) < 1e-4


def test_two_images(g906_model, vl_hf_model, hf_processor, vl_token_ids):
    loaded, vision = g906_model
    imgs = [_image(96, 64, 1), _image(70, 200, 2)]
    t = vl_token_ids
    prompt = [3, t["<|vision_start|>"], t["<|image_pad|>"], t["<|vision_end|>"], 8,
              t["<|vision_start|>"], t["<|image_pad|>"], t["<|vision_end|>"], 11, 12]
    ids, mm = vision.expand(prompt, vision.prepare_images(imgs))
    vision.encode(mm)
    ref = _hf_logits(vl_hf_model, hf_processor, ids, imgs)
    mine = _g906_logits(loaded.model, ids, mm, [len(ids)])
    assert rel_err(mine[-1], ref[-1]) < 1e-4


@torch.no_grad()
def _hf_greedy(model, processor, ids, images, n):
    seq = list(ids)
    for _ in range(n):
        seq.append(int(_hf_logits(model, processor, seq, images)[-1].argmax()))
    return seq[len(ids):]


def test_engine_greedy_matches_transformers(g906_model, vl_hf_model, hf_processor, vl_token_ids):
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sampling_params import SamplingParams

    loaded, vision = g906_model
    img = _image()
    ids, mm = vision.expand(_prompt(vl_token_ids), vision.prepare_images([img]))
    want = _hf_greedy(vl_hf_model, hf_processor, ids, [img], 6)
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=4, max_num_batched_tokens=7, max_model_len=128,
                                         num_kv_blocks=64, block_size=8), vision=vision)
    p = SamplingParams(temperature=0.0, max_tokens=6, ignore_eos=True)
    eng.add_request("text", [1, 2, 3, 4, 5, 6, 7, 8, 9], p)
    eng.add_request("img", ids, p, mm=mm)
    got: dict[str, list[int]] = {"text": [], "img": []}
    while eng.has_unfinished_requests():
        for out in eng.step():
            got[out.request_id].extend(out.new_token_ids)
    assert got["img"] == want
    assert eng.cache.blocks.num_used_blocks == 0
