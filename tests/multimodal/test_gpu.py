"""The vision path on a GPU: the tower in fp16/bf16/fp32 against transformers on CPU, the full model
with an image (prefill logits), and the start-up profile of the tower's memory peak."""

from __future__ import annotations

import io

import pytest
import torch

from g906.engine.loader import load_model
from g906.engine.vision.runtime import load_vision
from tests.engine.conftest import rel_err
from tests.multimodal.conftest import png_bytes

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA/ROCm GPU"),
]

TOLS = {"float32": 5e-3, "bfloat16": 6e-2, "float16": 2e-2}


def _image():
    from PIL import Image

    return Image.open(io.BytesIO(png_bytes(150, 100)))


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_image_prefill(vl_hf_dir, vl_hf_model, hf_processor, vl_token_ids, dtype):
    if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sampling_params import SamplingParams

    loaded = load_model(str(vl_hf_dir), dtype=dtype, device="cuda", progress=False)
    vision = load_vision(vl_hf_dir, text_config=loaded.config, tokenizer=loaded.tokenizer,
                         dtype=loaded.model.dtype, device="cuda")
    t = vl_token_ids
    prompt = [5, 17, t["<|vision_start|>"], t["<|image_pad|>"], t["<|vision_end|>"], 40, 41, 9]
    img = _image()
    ids, mm = vision.expand(prompt, vision.prepare_images([img]))
    vision.encode(mm)
    feats = hf_processor(images=[img], return_tensors="pt")
    with torch.no_grad():
        ref_emb = vl_hf_model.model.get_image_features(feats["pixel_values"], feats["image_grid_thw"]).pooler_output[0]
        inp = torch.tensor([ids])
        ref = vl_hf_model(input_ids=inp, pixel_values=feats["pixel_values"], image_grid_thw=feats["image_grid_thw"],
                          mm_token_type_ids=(inp == t["<|image_pad|>"]).int(), use_cache=False).logits[0, -1]
    assert mm.embeds.is_cuda
    assert rel_err(mm.embeds.float().cpu(), ref_emb) < TOLS[dtype]
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=256,
                                         num_kv_blocks=64, block_size=16), vision=vision)
    assert vision.profile(400, 300, 2) > 0
    eng.add_request("img", ids, SamplingParams(temperature=0.0, max_tokens=1, logprobs=5, ignore_eos=True), mm=mm)
    outs = []
    while eng.has_unfinished_requests():
        outs.extend(eng.step())
    assert outs[-1].new_token_ids[0] in ref.topk(3).indices.tolist()
