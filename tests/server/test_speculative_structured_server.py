"""Structured outputs under speculative decoding through the real server (`g906 up`, uvicorn, the
official openai client) on an HF model with an MTP block: a json_schema response_format and a
required tool call (grammar-constrained) give the same answers with [engine.speculative] as
without it, while vLLM's spec_decode counters move (the constrained requests speculate)."""

from __future__ import annotations

import json

import jsonschema
import pytest

from tests.engine.spec_models import MARKOV_EOS, markov_mtp_dir

from .conftest import openai_client, serving

RECIPE = """
[model]
source = "{source}"
name = "markov"

[limits]
max_model_len = 512
max_num_seqs = 4
max_num_batched_tokens = 64

[engine.embedded]
cpu_kv_cache_gib = 0.02
{spec}
[server]
api_key_env = "G906_TEST_API_KEY"
"""
SPEC = """
[engine.speculative]
method = "mtp"
num_speculative_tokens = 3
"""
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"type": "string", "maxLength": 4}},
          "required": ["a", "b"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 6},
                                     "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
    "required": ["city", "unit"], "additionalProperties": False}}}]
USERS = ["Weather in Paris?", "Give me a small object."]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return markov_mtp_dir(tmp_path_factory.mktemp("spec-structured-server"), eos_token_id=MARKOV_EOS)


def _answers(s) -> list:
    c = openai_client(s)
    out = []
    for text in USERS:
        msgs = [{"role": "user", "content": text}]
        r = c.chat.completions.create(
            model="markov", messages=msgs, max_tokens=80, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "obj", "schema": SCHEMA,
                                                                    "strict": True}})
        ch = r.choices[0]
        if ch.finish_reason == "stop":
            jsonschema.validate(json.loads(ch.message.content), SCHEMA)
        out.append(("json", ch.finish_reason, ch.message.content))
        r = c.chat.completions.create(model="markov", messages=msgs, max_tokens=120, temperature=0,
                                      tools=TOOLS, tool_choice="required")
        ch = r.choices[0]
        calls = [(t.function.name, t.function.arguments) for t in ch.message.tool_calls or []]
        if ch.finish_reason == "tool_calls":
            for _, args in calls:
                jsonschema.validate(json.loads(args), TOOLS[0]["function"]["parameters"])
        out.append(("tool", ch.finish_reason, ch.message.content, calls))
    return out


def test_structured_outputs_speculate_through_the_server(model_dir, tmp_path):
    (tmp_path / "plain").mkdir()
    gen = serving(tmp_path / "plain", RECIPE.format(source=model_dir, spec=""))
    s = next(gen)
    want = _answers(s)
    next(gen, None)
    assert sum(a[1] == "tool_calls" for a in want) >= 1, want      # (the random model's JSON may run long)

    (tmp_path / "spec").mkdir()
    gen = serving(tmp_path / "spec", RECIPE.format(source=model_dir, spec=SPEC))
    s = next(gen)
    before = s.metrics()                   # (the start-up warm-up may have speculated already)
    assert _answers(s) == want
    m = {k: v - before.get(k, 0) for k, v in s.metrics().items() if k.startswith("vllm:spec_decode")}
    assert m["vllm:spec_decode_num_drafts_total"] > 0, m
    assert 0 < m["vllm:spec_decode_num_accepted_tokens_total"] <= m["vllm:spec_decode_num_draft_tokens_total"], m
    next(gen, None)
