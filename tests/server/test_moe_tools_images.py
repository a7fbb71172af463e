"""Tools and images on the MoE model, end to end: `g906 up` serving a tiny multimodal Qwen3.5-MoE
as MI50 owners run the 35B-A3B (a GGUF with quantized experts, Q8_0, and its mmproj beside it),
with the real Qwen3.5 chat template, driven by the official openai client.

- tool_choice "required" and a named function: calls valid against the tool's schema
  (jsonschema), whole and streamed;
- an image_url request: the prompt is transformers' apply_chat_template with the image pad
  expanded to the image's merged patches (transformers' Qwen2-VL processor), and the greedy
  tokens are those of transformers' Qwen3_5MoeForConditionalGeneration holding the GGUF's
  dequantized weights; streamed and whole answers agree;
- the same checkpoint as safetensors (HF, with its vision tower) in the engine: greedy tokens
  after an image, in chunked prefill beside a text request, equal transformers'."""

from __future__ import annotations

import copy
import io
import json

import jsonschema
import pytest
import torch

from tests.engine.conftest import build_tiny_qwen35moe
from tests.multimodal.conftest import (  # noqa: F401 - fixtures
    PREPROCESSOR,
    VISION_CONFIG,
    data_url,
    png_bytes,
    randomise_vision,
    vl_token_ids,
    vl_tokenizer_dir,
)
from tests.server.agent_conversation import QWEN35_TEMPLATE, QWEN35_TEMPLATE_PATH
from tests.server.conftest import openai_client, serving
from tests.server.test_tools_e2e import NO_THINK, SCHEMAS, SMALL, USER, stream_message

NOEOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def moe_text():
    return build_tiny_qwen35moe(seed=3)


@pytest.fixture(scope="module")
def moe_vl(moe_text, vl_token_ids):
    """Qwen3_5MoeForConditionalGeneration: moe_text's weights and a tiny random vision tower."""
    from transformers import Qwen3_5MoeConfig, Qwen3_5MoeForConditionalGeneration

    text_cfg = {k: v for k, v in moe_text.config.to_dict().items() if k not in ("architectures", "dtype")}
    cfg = Qwen3_5MoeConfig(
        text_config=text_cfg, vision_config=dict(VISION_CONFIG, out_hidden_size=moe_text.config.hidden_size),
        image_token_id=vl_token_ids["<|image_pad|>"], video_token_id=vl_token_ids["<|video_pad|>"],
        vision_start_token_id=vl_token_ids["<|vision_start|>"], vision_end_token_id=vl_token_ids["<|vision_end|>"],
        tie_word_embeddings=False)
    torch.manual_seed(0)
    model = Qwen3_5MoeForConditionalGeneration(cfg).eval().to(torch.float32)
    with torch.no_grad():
        model.model.language_model.load_state_dict(moe_text.model.state_dict())
        model.lm_head.weight.copy_(moe_text.lm_head.weight)
    randomise_vision(model.model.visual, 7)
    return model


@pytest.fixture(scope="module")
def moe_vl_files(moe_vl, vl_tokenizer_dir, tmp_path_factory):
    """(GGUF with Q8_0 experts and the rest, its mmproj F32, the saved HF checkpoint)."""
    import shutil

    from tests.engine.gguf_writer import write_gguf
    from tests.multimodal.mmproj_writer import write_mmproj

    hf = tmp_path_factory.mktemp("moe-vl-hf")
    moe_vl.save_pretrained(hf)
    for f in vl_tokenizer_dir.iterdir():
        shutil.copy(f, hf / f.name)
    (hf / "preprocessor_config.json").write_text(json.dumps(PREPROCESSOR))
    d = tmp_path_factory.mktemp("moe-vl-gguf")
    main = write_gguf(hf, d / "tiny-moe-vl-Q8_0.gguf", qtype="Q8_0", tokenizer_dir=vl_tokenizer_dir)[0]
    mmproj = write_mmproj(hf, d / "mmproj-tiny-moe-vl-F32.gguf")
    return main, mmproj, hf


@pytest.fixture(scope="module")
def moe_server(moe_vl_files, tmp_path_factory):
    main = moe_vl_files[0]
    recipe = f"""
[model]
source = "{main}"
name = "tiny-moe-vl"
chat_template = "{QWEN35_TEMPLATE_PATH}"

[multimodal]
image = {{ count = 1, width = 400, height = 300 }}

[limits]
max_model_len = 4096
max_num_seqs = 4
max_num_batched_tokens = 256

[engine]
reasoning_parser = "qwen3"
"""
    yield from serving(tmp_path_factory.mktemp("moe-vl-up"), recipe)


@pytest.fixture(scope="module")
def client(moe_server):
    return openai_client(moe_server)


# --- tools ---------------------------------------------------------------------------------------

def _check_calls(calls, allowed):
    assert calls, "no tool call"
    for name, args in calls:
        assert name in allowed
        jsonschema.validate(json.loads(args), SCHEMAS[name])


@pytest.mark.parametrize("seed", range(2))
def test_tool_choice_required_gives_schema_valid_calls(client, seed):
    kw = dict(model="tiny-moe-vl", messages=USER, tools=SMALL, tool_choice="required", max_tokens=600, seed=seed,
              parallel_tool_calls=False, extra_body=NO_THINK)
    r = client.chat.completions.create(**kw)
    ch = r.choices[0]
    assert ch.finish_reason == "tool_calls" and len(ch.message.tool_calls) == 1
    assert ch.message.tool_calls[0].id.startswith("call_")
    _check_calls([(c.function.name, c.function.arguments) for c in ch.message.tool_calls], SCHEMAS)
    content, calls, finish = stream_message(client, **kw)
    assert finish == "tool_calls" and len(calls) == 1
    _check_calls([(n, a) for _, n, a in calls], SCHEMAS)


def test_named_tool_choice_calls_that_function(client):
    kw = dict(model="tiny-moe-vl", messages=USER, tools=SMALL, max_tokens=600, temperature=0, extra_body=NO_THINK,
              tool_choice={"type": "function", "function": {"name": "configure"}})
    r = client.chat.completions.create(**kw)
    calls = [(c.function.name, c.function.arguments) for c in r.choices[0].message.tool_calls]
    assert r.choices[0].finish_reason == "tool_calls"
    _check_calls(calls, {"configure"})
    _, s_calls, s_finish = stream_message(client, **kw)
    # greedy: the streamed call is the same call
    assert s_finish == "tool_calls" and [(n, json.loads(a)) for _, n, a in s_calls] == \
        [(n, json.loads(a)) for n, a in calls]


# --- images --------------------------------------------------------------------------------------

IMAGE = png_bytes(150, 100, seed=5)
QUESTION = "What is in the picture?"


def _messages():
    return [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": data_url(IMAGE)}},
                                         {"type": "text", "text": QUESTION}]}]


def _reference(moe_vl, moe_text, main, vl_tokenizer_dir, vl_token_ids, n):
    """(prompt ids, greedy ids) from transformers: the chat template, the Qwen2-VL processor at
    the defaults a GGUF + mmproj is served with (no preprocessor config: min 65536 pixels) and
    the model holding the GGUF's dequantized text weights."""
    from PIL import Image
    from transformers import AutoTokenizer
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from tests.engine.test_model_qwen35moe import dequantized_reference

    tok = AutoTokenizer.from_pretrained(str(vl_tokenizer_dir))
    tok.chat_template = QWEN35_TEMPLATE
    ids = tok.apply_chat_template(_messages(), add_generation_prompt=True, tokenize=True, return_dict=False,
                                  enable_thinking=False)
    proc = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size={"shortest_edge": 65_536, "longest_edge": 16_777_216})
    feats = proc(images=[Image.open(io.BytesIO(IMAGE))], return_tensors="pt")
    pad = vl_token_ids["<|image_pad|>"]
    merged = int(feats["image_grid_thw"].prod()) // 4
    at = ids.index(pad)
    ids = ids[:at] + [pad] * merged + ids[at + 1:]
    text = dequantized_reference(moe_text, str(main))
    ref = copy.deepcopy(moe_vl)
    with torch.no_grad():
        ref.model.language_model.load_state_dict(text.model.state_dict())
        ref.lm_head.weight.copy_(text.lm_head.weight)
        seq = list(ids)
        for _ in range(n):
            inp = torch.tensor([seq])
            out = ref(input_ids=inp, pixel_values=feats["pixel_values"], image_grid_thw=feats["image_grid_thw"],
                      mm_token_type_ids=(inp == pad).int(), use_cache=False)
            seq.append(int(out.logits[0, -1].argmax()))
    return ids, seq[len(ids):]


def test_image_chat_is_transformers(client, moe_vl, moe_text, moe_vl_files, vl_tokenizer_dir, vl_token_ids):
    n = 6
    kw = dict(model="tiny-moe-vl", messages=_messages(), max_tokens=n, temperature=0,
              extra_body={**NO_THINK, **NOEOS, "return_token_ids": True})
    r = client.chat.completions.create(**kw)
    prompt, want = _reference(moe_vl, moe_text, moe_vl_files[0], vl_tokenizer_dir, vl_token_ids, n)
    extra = r.model_extra or {}
    assert extra["prompt_token_ids"] == prompt
    assert r.usage.prompt_tokens == len(prompt)
    assert (r.choices[0].model_extra or {})["token_ids"] == want
    # streamed: the same text
    text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(stream=True, **kw)
                   if c.choices)
    assert text == (r.choices[0].message.content or "")


def test_hf_checkpoint_engine_greedy_with_an_image(moe_vl, moe_vl_files, vl_token_ids):
    """The safetensors checkpoint (Qwen3_5MoeForConditionalGeneration, its preprocessor config):
    the engine's greedy tokens after an image prompt equal transformers', beside a text request."""
    from PIL import Image
    from transformers.models.qwen2_vl.image_processing_pil_qwen2_vl import Qwen2VLImageProcessorPil

    from g906.engine.llm_engine import EngineConfig, LLMEngine
    from g906.engine.loader import load_model
    from g906.engine.sampling_params import SamplingParams
    from g906.engine.vision.runtime import load_vision

    hf = moe_vl_files[2]
    loaded = load_model(str(hf), dtype="float32", device="cpu", progress=False)
    vision = load_vision(hf, text_config=loaded.config, tokenizer=loaded.tokenizer)
    t = vl_token_ids
    img = Image.open(io.BytesIO(png_bytes(96, 64, seed=6)))
    ids, mm = vision.expand([5, 17, t["<|vision_start|>"], t["<|image_pad|>"], t["<|vision_end|>"], 40, 41, 9],
                            vision.prepare_images([img]))
    proc = Qwen2VLImageProcessorPil(patch_size=16, temporal_patch_size=2, merge_size=2, image_mean=[0.5] * 3,
                                    image_std=[0.5] * 3, size=dict(PREPROCESSOR["size"]))
    feats = proc(images=[img], return_tensors="pt")
    assert ids.count(t["<|image_pad|>"]) == int(feats["image_grid_thw"].prod()) // 4
    seq = list(ids)
    with torch.no_grad():
        for _ in range(5):
            inp = torch.tensor([seq])
            out = moe_vl(input_ids=inp, pixel_values=feats["pixel_values"], image_grid_thw=feats["image_grid_thw"],
                         mm_token_type_ids=(inp == t["<|image_pad|>"]).int(), use_cache=False)
            seq.append(int(out.logits[0, -1].argmax()))
    eng = LLMEngine(loaded, EngineConfig(max_num_seqs=2, max_num_batched_tokens=16, max_model_len=128,
                                         num_kv_blocks=32, block_size=8), vision=vision)
    p = SamplingParams(temperature=0.0, max_tokens=5, ignore_eos=True)
    eng.add_request("text", [1, 2, 3, 4, 5, 6], p)
    eng.add_request("img", ids, p, mm=mm)
    got: dict[str, list[int]] = {"text": [], "img": []}
    while eng.has_unfinished_requests():
        for o in eng.step():
            got[o.request_id].extend(o.new_token_ids)
    assert got["img"] == seq[len(ids):]


def test_image_beyond_the_recipe_limit_is_400(client):
    import openai

    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model="tiny-moe-vl", max_tokens=2, messages=[{"role": "user", "content": [
            {"type": "image_url", "image_url": {"url": data_url(png_bytes(401, 100))}}]}])
    assert "beyond this server's limit of 400x300" in str(exc.value)
