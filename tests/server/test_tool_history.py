"""History in: an agent conversation as OpenAI clients send it (tool calls with string or object
arguments, tool results, earlier reasoning) renders the same prompt tokens as transformers'
apply_chat_template with the real Qwen3.5 template; malformed tool calls in the history are 400s."""

from __future__ import annotations

import pytest

from g906.engine.builtin import build_tokenizer
from g906.engine.chat_template import ChatTemplate
from g906.server import protocol as P
from g906.server.chat_completions import template_messages
from g906.server.errors import APIError

from .agent_conversation import AGENT_CONVERSATION, QWEN35_TEMPLATE, TOOLS, hf_tokenizer_for, reference_messages


@pytest.fixture(scope="module")
def tok():
    return build_tokenizer()


@pytest.mark.parametrize("thinking", [None, True, False])
@pytest.mark.parametrize("upto", [3, 5, 7, len(AGENT_CONVERSATION)])
def test_agent_history_matches_transformers(tok, thinking, upto):
    messages = AGENT_CONVERSATION[:upto]
    if messages[-1]["role"] == "assistant":
        messages = messages + [{"role": "user", "content": "go on"}]
    kwargs = {} if thinking is None else {"enable_thinking": thinking}
    req = P.ChatCompletionRequest.model_validate({"messages": messages, "tools": TOOLS,
                                                  "chat_template_kwargs": kwargs})
    ours = ChatTemplate(QWEN35_TEMPLATE, special_tokens=tok.special_tokens_map).render(
        template_messages(req), add_generation_prompt=True, tools=req.tools, **kwargs)
    hf = hf_tokenizer_for(tok, QWEN35_TEMPLATE)
    ref_text = hf.apply_chat_template(reference_messages(messages), tools=TOOLS, add_generation_prompt=True,
                                      tokenize=False, **kwargs)
    ref_ids = hf.apply_chat_template(reference_messages(messages), tools=TOOLS, add_generation_prompt=True,
                                     tokenize=True, return_dict=False, **kwargs)
    assert ours == ref_text
    assert tok.encode(ours) == list(ref_ids)
    assert "<parameter=city>\nParis\n</parameter>" in ours      # a string argument reached the template parsed


@pytest.mark.parametrize("call,needle", [
    ({"type": "function", "function": {"name": "f", "arguments": "{not json"}}, "is not valid JSON"),
    ({"type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}, "must be a JSON object"),
    ({"type": "function", "function": {"arguments": "{}"}}, "needs function.name"),
    ({"type": "function"}, "needs function.name"),
])
def test_bad_history_tool_calls_are_named(call, needle):
    req = P.ChatCompletionRequest.model_validate({"messages": [
        {"role": "user", "content": "hi"}, {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "user", "content": "again"}]})
    with pytest.raises(APIError) as ei:
        template_messages(req)
    assert ei.value.status == 400 and needle in ei.value.message
    assert ei.value.param.startswith("messages.1.tool_calls.0")
