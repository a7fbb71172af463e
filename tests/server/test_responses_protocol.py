"""The Responses request's translation into the chat request, in-process: input items into chat
messages (one assistant turn per reasoning + text + calls, tool outputs as tool messages, images
as image_url parts), tools and namespaces, tool_choice, text.format, reasoning.effort, include,
and the fields passed through or named as ignored."""

from __future__ import annotations

import pytest

from g906.server.errors import APIError
from g906.server.responses_protocol import ResponsesRequest, ignored_fields, translate


def tr(body: dict, history=None):
    return translate(ResponsesRequest.model_validate(body), history or [])


def msgs(t) -> list[dict]:
    return [m.model_dump(exclude_none=True, exclude={"name"}) for m in t.chat.messages]


def test_string_input_and_instructions():
    t = tr({"input": "Hi", "instructions": "Be brief."})
    assert msgs(t) == [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}]
    # the instructions are not part of the stored conversation (OpenAI: not carried over)
    assert t.history == [{"role": "user", "content": "Hi"}]
    assert [i["type"] for i in t.input_items] == ["message"] and t.input_items[0]["id"].startswith("msg_")


def test_one_assistant_turn_per_reasoning_text_and_calls():
    t = tr({"input": [
        {"role": "developer", "content": "D"},
        {"role": "user", "content": [{"type": "input_text", "text": "U1"}, {"type": "input_text", "text": "+"}]},
        {"type": "reasoning", "content": [{"type": "reasoning_text", "text": "R1"}], "summary": []},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "A1"}]},
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"x\": 1}"},
        {"type": "function_call", "call_id": "c2", "name": "g", "arguments": "{}", "namespace": "ns"},
        {"type": "function_call_output", "call_id": "c1", "output": "out1"},
        {"type": "function_call_output", "call_id": "c2", "output": [{"type": "input_text", "text": "out2"}]},
        {"type": "reasoning", "summary": [], "encrypted_content": "opaque"},
        {"role": "assistant", "content": [{"type": "refusal", "refusal": "no"}]},
        {"role": "user", "content": "U2"},
    ]})
    assert msgs(t) == [
        {"role": "system", "content": "D"},
        {"role": "user", "content": "U1+"},
        {"role": "assistant", "content": "A1", "reasoning_content": "R1", "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{\"x\": 1}"}},
            {"id": "c2", "type": "function", "function": {"name": "ns__g", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "out1"},
        {"role": "tool", "tool_call_id": "c2", "content": "out2"},
        {"role": "assistant", "content": "no"},
        {"role": "user", "content": "U2"},
    ]
    # the empty reasoning item is dropped from the listing too; the others get ids
    assert [i["type"] for i in t.input_items] == ["message", "message", "reasoning", "message", "function_call",
                                                  "function_call", "function_call_output", "function_call_output",
                                                  "message", "message"]
    assert t.input_items[5]["namespace"] == "ns"
    assert all(i["id"] for i in t.input_items)


def test_text_after_calls_starts_a_new_turn_and_history_comes_first():
    earlier = [{"role": "user", "content": "old"}, {"role": "assistant", "content": "old answer"}]
    t = tr({"input": [{"type": "function_call", "call_id": "c", "name": "f", "arguments": ""},
                      {"role": "assistant", "content": "after"}]}, earlier)
    m = msgs(t)
    assert m[:2] == earlier
    assert m[2]["tool_calls"][0]["function"]["arguments"] == "{}" and m[2]["content"] == ""
    assert m[3] == {"role": "assistant", "content": "after"}


def test_images_become_image_url_parts():
    url = "data:image/png;base64,AAAA"
    t = tr({"input": [{"role": "user", "content": [{"type": "input_text", "text": "see"},
                                                   {"type": "input_image", "image_url": url, "detail": "auto"}]},
                      {"type": "function_call_output", "call_id": "c", "output": [
                          {"type": "input_image", "image_url": "https://example.com/a.png"}]}]})
    user, tool = t.chat.messages
    assert [p.model_dump(exclude_none=True) for p in user.content] == [
        {"type": "text", "text": "see"}, {"type": "image_url", "image_url": {"url": url}}]
    assert tool.content[0].model_dump()["image_url"] == {"url": "https://example.com/a.png"}
    with pytest.raises(APIError) as e:
        tr({"input": [{"role": "user", "content": [{"type": "input_image", "file_id": "file-1"}]}]})
    assert e.value.param == "input.0.content.0.image_url" and "file_id" in e.value.message
    with pytest.raises(APIError) as e:          # images are the user's (and tool outputs')
        tr({"input": [{"role": "assistant", "content": [{"type": "input_image", "image_url": url}]}]})
    assert e.value.param == "input.0.content.0.type"


def test_tools_namespaces_and_tool_choice():
    fn = {"type": "function", "name": "f", "description": "F", "parameters": {"type": "object", "properties": {}},
          "strict": True}
    ns = {"type": "namespace", "name": "mcp__pc", "description": "PC", "tools": [{"type": "function", "name": "g"}]}
    t = tr({"input": "x", "tools": [fn, ns], "tool_choice": {"type": "function", "name": "g", "namespace": "mcp__pc"},
            "parallel_tool_calls": False})
    assert [x["function"]["name"] for x in t.chat.tools] == ["f", "mcp__pc__g"]
    assert t.chat.tools[0]["function"]["strict"] is True and t.chat.tools[0]["function"]["description"] == "F"
    assert t.namespaces == {"mcp__pc__g": ("mcp__pc", "g")}
    assert t.chat.tool_choice == {"type": "function", "function": {"name": "mcp__pc__g"}}
    assert t.chat.parallel_tool_calls is False
    assert [x["type"] for x in t.tools] == ["function", "namespace"]
    for choice in ("auto", "none", "required"):
        assert tr({"input": "x", "tools": [fn], "tool_choice": choice}).chat.tool_choice == choice
    for choice in ("auto", "none"):          # without tools: nothing to call, not an error
        assert tr({"input": "x", "tools": [], "tool_choice": choice}).chat.tools is None
    with pytest.raises(APIError) as e:
        tr({"input": "x", "tools": [fn, dict(fn)]})
    assert e.value.param == "tools.1.name" and "twice" in e.value.message
    with pytest.raises(APIError) as e:
        tr({"input": "x", "tools": [{"type": "function", "name": "f", "parameters": {"type": "array"}}]})
    assert e.value.param == "tools.0.parameters"


def test_formats_reasoning_and_include():
    t = tr({"input": "x", "text": {"format": {"type": "json_schema", "name": "n", "schema": {"type": "object"},
                                              "strict": True, "description": "d"}, "verbosity": "low"},
            "reasoning": {"effort": "none", "summary": "auto"},
            "include": ["message.output_text.logprobs", "reasoning.encrypted_content"], "top_logprobs": 4})
    rf = t.chat.response_format
    assert rf.type == "json_schema" and rf.json_schema.schema_ == {"type": "object"} and rf.json_schema.name == "n"
    assert t.chat.chat_template_kwargs == {"enable_thinking": False}
    assert t.chat.logprobs is True and t.chat.top_logprobs == 4
    assert sorted(t.ignored) == ["include[reasoning.encrypted_content]", "reasoning.summary", "text.verbosity"]
    assert tr({"input": "x", "text": {"format": {"type": "json_object"}}}).chat.response_format.type == "json_object"
    assert tr({"input": "x", "text": {"format": {"type": "text"}}}).chat.response_format is None
    # effort other than none: thinking stays on, the level is named as not applied
    t = tr({"input": "x", "reasoning": {"effort": "low"}, "top_logprobs": 2})
    assert t.chat.chat_template_kwargs == {} and "reasoning.effort" in t.ignored and "top_logprobs" in t.ignored
    assert t.chat.logprobs is False
    # the request's own chat_template_kwargs win over the effort's switch
    t = tr({"input": "x", "reasoning": {"effort": "none"}, "chat_template_kwargs": {"enable_thinking": True}})
    assert t.chat.chat_template_kwargs == {"enable_thinking": True}


def test_sampling_fields_pass_through():
    t = tr({"input": "x", "max_output_tokens": 7, "temperature": 0.3, "top_p": 0.5, "top_k": 5, "min_p": 0.1,
            "seed": 3, "stop": ["END"], "repetition_penalty": 1.1, "presence_penalty": 0.5,
            "frequency_penalty": -0.5, "ignore_eos": True, "min_tokens": 2})
    c = t.chat
    assert (c.max_completion_tokens, c.temperature, c.top_p, c.top_k, c.min_p, c.seed, c.stop) == \
        (7, 0.3, 0.5, 5, 0.1, 3, ["END"])
    assert (c.repetition_penalty, c.presence_penalty, c.frequency_penalty, c.ignore_eos, c.min_tokens) == \
        (1.1, 0.5, -0.5, True, 2)


def test_accepted_but_unused_fields_are_named():
    req = ResponsesRequest.model_validate({"input": "x", "user": "u", "service_tier": "auto", "safety_identifier": "s",
                                           "prompt_cache_key": "k", "truncation": "auto", "conversation": "c",
                                           "metadata": {"a": "b"}, "store": False})
    assert sorted(ignored_fields(req)) == ["conversation", "prompt_cache_key", "safety_identifier", "service_tier",
                                           "user"]
    with pytest.raises(Exception):
        ResponsesRequest.model_validate({"input": "x", "metadata": {str(i): "v" for i in range(17)}})


# -- whatever a client sends: a 400 naming the field, never another exception -------------------------

from hypothesis import given, settings, strategies as st  # noqa: E402

_json = st.recursive(st.none() | st.booleans() | st.integers(-3, 3) | st.text(max_size=4),
                     lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                     max_leaves=8)
_kinds = st.sampled_from(["message", "function_call", "function_call_output", "reasoning", "input_text",
                          "output_text", "input_image", "refusal", "reasoning_text", "function", "namespace",
                          "json_schema", "json_object", "text", None])
_obj = st.fixed_dictionaries({}, optional={
    "type": _kinds, "role": st.sampled_from(["user", "assistant", "system", "developer", "tool", 3]),
    "content": _json | st.lists(st.fixed_dictionaries({"type": _kinds}, optional={"text": _json, "image_url": _json,
                                                                                     "refusal": _json}), max_size=3),
    "call_id": _json, "name": st.sampled_from(["f", "g", "a b", ""]) | _json, "arguments": _json | st.just("{}"),
    "output": _json, "namespace": _json, "summary": _json, "tools": st.lists(_json, max_size=2) | _json,
    "parameters": _json, "schema": _json, "format": _json, "effort": _json})


_text = st.text(max_size=5)
_part = st.fixed_dictionaries({"type": st.sampled_from(["input_text", "output_text", "refusal", "input_image",
                                                        "input_file"]),
                               "text": _text, "refusal": _text}, optional={"image_url": _text | _json})
_item = st.one_of(
    st.fixed_dictionaries({"role": st.sampled_from(["user", "assistant", "system", "developer"]),
                           "content": _text | st.lists(_part, max_size=3)}, optional={"type": st.just("message")}),
    st.fixed_dictionaries({"type": st.just("function_call"), "call_id": _text, "name": st.sampled_from(["f", "g"]),
                           "arguments": st.sampled_from(["{}", "{\"a\": 1}", "[1]", "x", ""])},
                          optional={"namespace": st.sampled_from(["ns", ""]) | _json}),
    st.fixed_dictionaries({"type": st.just("function_call_output"), "call_id": _text,
                           "output": _text | st.lists(_part, max_size=2)}),
    st.fixed_dictionaries({"type": st.just("reasoning")}, optional={
        "content": st.lists(st.fixed_dictionaries({"type": st.sampled_from(["reasoning_text", "x"]), "text": _text}),
                            max_size=2),
        "summary": st.lists(st.fixed_dictionaries({"type": st.just("summary_text"), "text": _text}), max_size=2)}),
    _obj)
_fn = st.fixed_dictionaries({"type": st.just("function"), "name": st.sampled_from(["f", "g", "a b"])},
                            optional={"parameters": st.just({"type": "object", "properties": {}}) | _json,
                                      "description": _text | _json, "strict": st.booleans()})
_tool = st.one_of(_fn, st.fixed_dictionaries({"type": st.just("namespace"), "name": st.sampled_from(["ns", ""]),
                                              "tools": st.lists(_fn, max_size=2)}), _obj)
_choice = st.sampled_from(["auto", "none", "required", "bogus"]) | st.fixed_dictionaries(
    {"type": st.sampled_from(["function", "mcp"]), "name": st.sampled_from(["f", "g", "h"])},
    optional={"namespace": st.just("ns")}) | _json
_format = st.fixed_dictionaries({"type": st.sampled_from(["text", "json_object", "json_schema", "yaml"])},
                                optional={"schema": st.just({"type": "object"}) | _json, "name": _text | _json})


@settings(max_examples=400, deadline=None)
@given(input=_text | st.lists(_item, max_size=5), tools=st.none() | st.lists(_tool, max_size=3),
       tool_choice=st.none() | _choice, text=st.none() | st.fixed_dictionaries({"format": _format | _json}),
       reasoning=st.none() | st.fixed_dictionaries({}, optional={"effort": st.sampled_from(["none", "low", "max"]),
                                                                 "summary": _json}),
       include=st.none() | st.lists(st.sampled_from(["message.output_text.logprobs", "x",
                                                     "reasoning.encrypted_content"]), max_size=2))
def test_any_request_is_translated_or_refused_with_a_400(input, tools, tool_choice, text, reasoning, include):
    body = {"input": input, "tools": tools, "tool_choice": tool_choice, "text": text, "reasoning": reasoning,
            "include": include}
    try:
        req = ResponsesRequest.model_validate({k: v for k, v in body.items() if v is not None})
    except Exception:       # noqa: BLE001 - pydantic's refusal: the intake makes it a 400 naming the field
        return
    try:
        translate(req, [])
    except APIError as exc:
        assert exc.status == 400 and exc.message and exc.param


def test_drop_oldest_turn():
    from g906.server.responses_protocol import drop_oldest_turn

    t = tr({"instructions": "S", "input": [
        {"role": "user", "content": "u1"},
        {"type": "function_call", "call_id": "c", "name": "f", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c", "output": "o"},
        {"role": "user", "content": "u2"}, {"role": "assistant", "content": "a2"}, {"role": "user", "content": "u3"}]})
    chat = drop_oldest_turn(t.chat)
    assert [m.role for m in chat.messages] == ["system", "user", "assistant", "user"]
    assert chat.messages[1].content == "u2"
    chat = drop_oldest_turn(chat)
    assert [m.content for m in chat.messages] == ["S", "u3"]
    assert drop_oldest_turn(chat) is None
