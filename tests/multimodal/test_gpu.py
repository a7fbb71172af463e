"""The vision path on a GPU against the same path on the CPU in fp32 (itself checked against
transformers in test_model.py): image embeddings and the first sampled token's logits for a
prompt with an image, fp32/fp16/bf16; the start-up profile keeps the tower's peak out of the KV
cache budget."""

from __future__ import annotations

import io

import pytest
import torch

from g906.engine.loader import load_model
from g906.engine.vision.runtime import load_vision, reserve_vision_memory
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


def _prompt(t):
    return [5, 17, t["<|vision_start|>"], t["<|image_pad|>"], t["<|vision_end|>"], 40, 41, 9]


def _run(vl_hf_dir, t, dtype, device):
    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.sampling_params import SamplingParams

    loaded = load_model(str(vl_hf_dir), dtype=dtype, device=device, progress=False)
    vision = load_vision(vl_hf_dir, text_config=loaded.config, tokenizer=loaded.tokenizer,
                         dtype=loaded.model.dtype, device=device)
    ids, mm = vision.expand(_prompt(t), vision.prepare_images([_image()]))
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=256,
                                         num_kv_blocks=64, block_size=16), vision=vision)
    eng.add_request("img", ids, SamplingParams(temperature=0.0, max_tokens=4, logprobs=5, ignore_eos=True), mm=mm)
    outs = []
    while eng.has_unfinished_requests():
        outs.extend(eng.step())
    return mm.embeds.float().cpu(), [o.new_token_ids[0] for o in outs], outs[0].new_logprobs[0]


@pytest.fixture(scope="module")
def cpu_ref(vl_hf_dir, vl_token_ids):
    return _run(vl_hf_dir, vl_token_ids, "float32", "cpu")


@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
def test_gpu_image_prefill(vl_hf_dir, vl_token_ids, cpu_ref, dtype):
    if dtype == "bfloat16" and not torch.cuda.is_bf16_supported():
        pytest.skip("no bf16 on this GPU")
    emb, toks, _ = _run(vl_hf_dir, vl_token_ids, dtype, "cuda")
    ref_emb, ref_toks, ref_lp = cpu_ref
    assert rel_err(emb, ref_emb) < TOLS[dtype]
    assert toks[0] in [t for t, _ in ref_lp.top][:3]
    if dtype == "float32":
        assert toks == ref_toks


def test_profile_reserves_the_tower_peak(vl_hf_dir):
    from g906.engine.llm_engine import EngineConfig, LLMEngine

    loaded = load_model(str(vl_hf_dir), dtype="float16", device="cuda", progress=False)
    vision = load_vision(vl_hf_dir, text_config=loaded.config, tokenizer=loaded.tokenizer,
                         dtype=loaded.model.dtype, device="cuda")
    vision.configure_limits(count=2, width=1024, height=1024)
    cfg = EngineConfig(max_num_seqs=2, max_num_batched_tokens=64, max_model_len=256, gpu_memory_utilization=0.5)
    plain = LLMEngine(loaded, cfg).runner.sizing.budget_bytes
    with reserve_vision_memory(vision) as r:
        reserved = LLMEngine(loaded, cfg, vision=vision).runner.sizing.budget_bytes
    print(f"vision peak {r.peak / 2**20:.1f} MiB; budget {plain / 2**30:.3f} -> {reserved / 2**30:.3f} GiB")
    assert r.peak > 0
    assert reserved <= plain - 0.9 * r.peak
    assert vision.info["vision_profile"]["width"] == 1024
