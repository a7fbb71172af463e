"""Test data: the real Qwen3.5 chat template (tests/data/qwen35_chat_template.jinja, from the
model's tokenizer_config), tools with every parameter type, and a multi-turn agent conversation
as an OpenAI client sends it back (string and object arguments, tool results as text and parts,
earlier reasoning)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

QWEN35_TEMPLATE_PATH = Path(__file__).resolve().parent.parent / "data" / "qwen35_chat_template.jinja"
QWEN35_TEMPLATE = QWEN35_TEMPLATE_PATH.read_text(encoding="utf-8")

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14},
        "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    }, "required": ["city"]}}}

TYPED = {"type": "function", "function": {
    "name": "configure", "description": "Every JSON type",
    "parameters": {"type": "object", "properties": {
        "name": {"type": "string"},
        "count": {"type": "integer"},
        "ratio": {"type": "number"},
        "enabled": {"type": "boolean"},
        "options": {"type": "object", "properties": {"depth": {"type": "integer"}, "tags": {
            "type": "array", "items": {"type": "string"}}}, "required": ["depth"]},
        "items": {"type": "array", "items": {"type": "integer"}},
        "note": {"anyOf": [{"type": "string"}, {"type": "null"}]},
        "limit": {"type": ["integer", "null"]},
    }, "required": ["name", "count", "enabled"]}}}

TOOLS = [WEATHER, TYPED]

AGENT_CONVERSATION = [
    {"role": "system", "content": "You are a careful agent."},
    {"role": "user", "content": "Weather in Paris and Oslo, then configure the probe."},
    {"role": "assistant", "content": "Let me check both cities.", "reasoning_content": "Two calls are needed.",
     "tool_calls": [
         {"id": "call_1", "type": "function",
          "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}},
         {"id": "call_2", "type": "function",
          "function": {"name": "get_weather", "arguments": {"city": "Oslo", "unit": "celsius"}}},
     ]},
    {"role": "tool", "tool_call_id": "call_1", "content": "{\"temp\": 21}"},
    {"role": "tool", "tool_call_id": "call_2", "content": [{"type": "text", "text": "cold: "},
                                                          {"type": "text", "text": "-3"}]},
    {"role": "assistant", "content": None, "reasoning": "Now the probe.",
     "tool_calls": [{"id": "call_3", "type": "function", "function": {
         "name": "configure",
         "arguments": "{\"name\": \"probe\", \"count\": 3, \"enabled\": true, \"options\": {\"depth\": 2, "
                      "\"tags\": [\"a\", \"b\"]}, \"note\": null}"}}]},
    {"role": "tool", "tool_call_id": "call_3", "content": "ok"},
    {"role": "assistant", "content": "Paris is mild, Oslo is cold; the probe is set."},
    {"role": "user", "content": "Thanks! And tomorrow in Paris?"},
]


def reference_messages(messages: list[dict]) -> list[dict]:
    """What transformers' apply_chat_template is given: arguments as objects, text parts joined
    (the normalisation vLLM applies before the template)."""
    out = copy.deepcopy(messages)
    for m in out:
        if isinstance(m.get("content"), list):
            m["content"] = "".join(p["text"] for p in m["content"])
        if m.get("content") is None:
            m.pop("content", None)
        if "reasoning" in m and "reasoning_content" not in m:
            m["reasoning_content"] = m["reasoning"]
        for call in m.get("tool_calls") or []:
            if isinstance(call["function"]["arguments"], str):
                call["function"]["arguments"] = json.loads(call["function"]["arguments"])
    return out


def hf_tokenizer_for(tokenizer, template: str):
    """A transformers tokenizer over the same tokenizers backend, with `template` as its chat template."""
    from transformers import PreTrainedTokenizerFast

    hf = PreTrainedTokenizerFast(tokenizer_object=tokenizer.backend, **tokenizer.special_tokens_map)
    hf.chat_template = template
    return hf
