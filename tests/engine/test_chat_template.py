"""Chat templates render exactly as transformers' apply_chat_template (with and without the
generation prompt, enable_thinking, tools, reasoning, tool calls), in a sandbox, with clear
errors; templates load from GGUF metadata, HF files or an override."""

from __future__ import annotations

import json

import pytest

from g906.engine.builtin import CHAT_TEMPLATE as BUILTIN_TEMPLATE
from g906.engine.chat_template import ChatTemplate, load_chat_template, read_template_file
from g906.engine.tokenizer import Tokenizer
from g906.errors import G906Error

from .qwen_tokenizer import CHAT_TEMPLATE as TEST_TEMPLATE
from .qwen_tokenizer import qwen_tokenizer_dir  # noqa: F401 - fixture

TOOLS = [{
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, with “quotes” & <tags>",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]},
    },
}]

CONVERSATIONS = {
    "single": [{"role": "user", "content": "Hi there!"}],
    "system": [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "你好 🙂"}],
    "multi_turn": [
        {"role": "user", "content": "What is 2+2?"},
        {"role": "assistant", "content": "4", "reasoning_content": "simple arithmetic"},
        {"role": "user", "content": "And 3+3?"},
    ],
    "tool_calls": [
        {"role": "system", "content": "Use tools."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"city": "Paris"}}}]},
        {"role": "tool", "content": "{\"temp\": 21}"},
    ],
    "reasoning_after_last_user": [
        {"role": "user", "content": "think please"},
        {"role": "assistant", "content": "done", "reasoning_content": "pondering"},
    ],
}


@pytest.fixture(scope="module")
def hf_tok(qwen_tokenizer_dir):  # noqa: F811
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(qwen_tokenizer_dir))


def _cases():
    for tname in ("test", "builtin"):
        for conv in CONVERSATIONS:
            for agp in (True, False):
                for kwargs in ({}, {"enable_thinking": False}, {"enable_thinking": True}):
                    for tools in (None, TOOLS):
                        yield pytest.param(tname, conv, agp, kwargs, tools,
                                           id=f"{tname}-{conv}-agp{int(agp)}-{'-'.join(f'{k}{v}' for k, v in kwargs.items()) or 'default'}-{'tools' if tools else 'notools'}")


@pytest.mark.parametrize("tname,conv,agp,kwargs,tools", list(_cases()))
def test_render_matches_apply_chat_template(hf_tok, qwen_tokenizer_dir, tname, conv, agp, kwargs, tools):  # noqa: F811
    source = {"test": TEST_TEMPLATE, "builtin": BUILTIN_TEMPLATE}[tname]
    ours = ChatTemplate(source, special_tokens=Tokenizer.from_hf_dir(qwen_tokenizer_dir).special_tokens_map)
    msgs = CONVERSATIONS[conv]
    got = ours.render(msgs, add_generation_prompt=agp, tools=tools, **kwargs)
    ref = hf_tok.apply_chat_template(msgs, tools=tools, add_generation_prompt=agp, tokenize=False,
                                     chat_template=source, **kwargs)
    assert got == ref


def test_generation_prompt_opens_think():
    t = ChatTemplate(BUILTIN_TEMPLATE)
    assert t.render([{"role": "user", "content": "hi"}]).endswith("<|im_start|>assistant\n<think>\n")
    assert t.render([{"role": "user", "content": "hi"}], enable_thinking=False).endswith(
        "<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_helpers_behave_like_transformers(hf_tok):
    src = ("{{ messages[0].content | tojson }}|{{ {'b': 1, 'a': [1, 2]} | tojson(indent=2) }}|"
           "{% set ns = namespace(n=0) %}{% for m in messages %}{% if loop.first %}{% continue %}{% endif %}"
           "{% set ns.n = ns.n + 1 %}{% endfor %}{{ ns.n }}|{{ bos_token }}|{{ eos_token }}|{{ strftime_now('%Y') }}")
    msgs = [{"role": "user", "content": "<b>&\"é\""}, {"role": "user", "content": "x"}]
    ours = ChatTemplate(src, special_tokens={"eos_token": "<|im_end|>"})
    assert ours.render(msgs, bos_token="") == hf_tok.apply_chat_template(msgs, tokenize=False, chat_template=src,
                                                                         bos_token="")


def test_errors_are_clear():
    with pytest.raises(G906Error, match="syntax error"):
        ChatTemplate("{% for m in messages %}", origin="x.jinja")
    t = ChatTemplate("{{ raise_exception('no system messages please') }}")
    with pytest.raises(G906Error, match="no system messages please"):
        t.render([{"role": "user", "content": "hi"}])
    with pytest.raises(G906Error, match="unknown message role"):
        ChatTemplate(BUILTIN_TEMPLATE).render([{"role": "wizard", "content": "hi"}])
    with pytest.raises(G906Error, match="empty"):
        ChatTemplate("   ")


def test_sandbox_blocks_escapes():
    for src in ("{{ messages.__class__.__mro__ }}", "{{ ''.__class__.__subclasses__() }}",
                "{{ cycler.__init__.__globals__ }}", "{% set ns = namespace() %}{% set ns._x = 1 %}"):
        with pytest.raises(G906Error):
            ChatTemplate(src).render([{"role": "user", "content": "x"}])


def test_rich_inputs_reach_the_template_as_plain_data():
    class Msg:
        def model_dump(self):
            return {"role": "user", "content": "from pydantic-like"}

    out = ChatTemplate("{% for m in messages %}{{ m.role }}:{{ m.content }}{% endfor %}").render([Msg()])
    assert out == "user:from pydantic-like"


def test_load_chat_template_sources(tmp_path, qwen_tokenizer_dir):  # noqa: F811
    assert load_chat_template(hf_dir=qwen_tokenizer_dir) == TEST_TEMPLATE
    assert load_chat_template(gguf_metadata={"tokenizer.chat_template": "{{ 1 }}"}, hf_dir=qwen_tokenizer_dir) == "{{ 1 }}"
    over = tmp_path / "mine.jinja"
    over.write_text("{{ 2 }}")
    assert load_chat_template(override=over, gguf_metadata={"tokenizer.chat_template": "x"}) == "{{ 2 }}"
    cfg = tmp_path / "tokenizer_config.json"
    cfg.write_text(json.dumps({"chat_template": [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]}))
    assert read_template_file(cfg) == "D"
    assert load_chat_template(hf_dir=tmp_path) == "D"
    with pytest.raises(G906Error, match="not found"):
        read_template_file(tmp_path / "nope.jinja")
    assert load_chat_template(hf_dir=tmp_path / "empty") is None
