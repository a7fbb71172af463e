"""The MoE model served: `g906 up` on a tiny Qwen3.5-MoE GGUF (Q8_0 experts, kept quantized)
with its tokenizer, driven by the official openai client. The served greedy text is
transformers' greedy continuation on the file's dequantized weights; chat answers streamed and
whole agree."""

from __future__ import annotations

import pytest

from tests.engine.conftest import build_tiny_qwen35moe, hf_greedy
from tests.engine.qwen_tokenizer import qwen_tokenizer_dir  # noqa: F401 - fixture
from tests.server.conftest import openai_client, serving

NOEOS = {"ignore_eos": True}


@pytest.fixture(scope="module")
def moe_model():
    return build_tiny_qwen35moe(seed=2)


@pytest.fixture(scope="module")
def moe_gguf(moe_model, qwen_tokenizer_dir, tmp_path_factory):
    from tests.engine.gguf_writer import write_gguf

    d = tmp_path_factory.mktemp("moe-serve")
    return write_gguf(moe_model, d / "tiny-moe-Q8_0.gguf", qtype="Q8_0", tokenizer_dir=qwen_tokenizer_dir)[0]


@pytest.fixture(scope="module")
def moe_server(moe_gguf, tmp_path_factory):
    recipe = f"""
[model]
source = "{moe_gguf}"
name = "tiny-moe"
mmproj = "none"

[limits]
max_model_len = 256
max_num_seqs = 4

[engine]
reasoning_parser = "qwen3"
"""
    yield from serving(tmp_path_factory.mktemp("moe-up"), recipe)


def test_served_greedy_text_is_transformers(moe_server, moe_model, moe_gguf):
    from g906.engine.loaders.gguf import GGUFModelFile
    from tests.engine.test_model_qwen35moe import dequantized_reference

    client = openai_client(moe_server)
    assert [m.id for m in client.models.list().data] == ["tiny-moe"]
    ids = [17, 301, 42, 99, 5, 250, 7, 388]
    r = client.completions.create(model="tiny-moe", prompt=ids, max_tokens=8, temperature=0, extra_body=NOEOS)
    assert r.usage.completion_tokens == 8
    want = hf_greedy(dequantized_reference(moe_model, moe_gguf), ids, 8)
    # the file's own tokenizer (its vocabulary padded with [PADi] tokens as the converter pads it)
    assert r.choices[0].text == GGUFModelFile.open(moe_gguf).tokenizer().decode(want)


def test_chat_streamed_and_whole_agree(moe_server):
    client = openai_client(moe_server)
    kw = dict(model="tiny-moe", messages=[{"role": "user", "content": "Hello, who are you?"}], max_tokens=12,
              temperature=0, extra_body=NOEOS)
    full = client.chat.completions.create(**kw)
    msg = full.choices[0].message
    whole = (getattr(msg, "reasoning_content", None) or (msg.model_extra or {}).get("reasoning_content") or "") \
        + (msg.content or "")
    chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    text = ""
    for c in chunks:
        for ch in c.choices:
            extra = ch.delta.model_extra or {}
            text += (extra.get("reasoning_content") or getattr(ch.delta, "reasoning_content", None) or "")
            text += ch.delta.content or ""
    assert text == whole
    assert chunks[-1].usage.completion_tokens == full.usage.completion_tokens == 12
