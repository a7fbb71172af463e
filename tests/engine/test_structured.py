"""Structured outputs in the engine: constraints compile with llguidance (bad ones are refused
with its message), one matcher per sequence follows what it samples, a constraint may start
after a marker (the end of the reasoning), and the offline API's outputs match their constraint
under batching, n > 1 and stop strings."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest
import torch

from g906.engine.builtin import build_tokenizer
from g906.engine.sampling_params import SamplingParams
from g906.engine.structured import StructuredOutputsError, StructuredOutputsParams as S
from g906.engine.structured.grammar import GrammarCompiler
from g906.engine.structured.guide import Guide
from g906.engine.structured.mask import allocate, allowed, apply

EOS = [427, 425]


@pytest.fixture(scope="module")
def grammars():
    return GrammarCompiler(build_tokenizer(), 434, EOS)


def allowed_ids(guide: Guide) -> list[int]:
    bm = allocate(1, 434)
    guide.fill(bm, 0)
    return allowed(bm, 434, torch.device("cpu"))[0].nonzero()[:, 0].tolist()


@pytest.mark.parametrize("spec,needle", [
    (dict(regex="a(b"), "unclosed group"),
    (dict(json={"type": "wat"}), "wat"),
    (dict(grammar="start: nothing_here"), "nothing_here"),
    (dict(json="{oops"), "not valid JSON"),
])
def test_bad_constraints_are_named(grammars, spec, needle):
    with pytest.raises(StructuredOutputsError) as ei:
        grammars.compile(S(**spec))
    assert needle in str(ei.value)


@pytest.mark.parametrize("fields", [{}, {"regex": "a", "choice": ["b"]}, {"choice": []}, {"regex": ""}])
def test_exactly_one_constraint(fields):
    with pytest.raises(StructuredOutputsError):
        S(**fields)


def test_gbnf_grammars_are_translated(grammars):
    guide = Guide(grammars.matcher(S(grammar='root ::= "yes" | "no"')))
    tok = build_tokenizer()
    assert {tok.decode([t]) for t in allowed_ids(guide)} <= {"y", "ye", "yes", "n", "no"}


def test_the_constraint_starts_after_the_marker(grammars):
    tok = build_tokenizer()
    end = tok.encode("</think>")
    guide = Guide(grammars.matcher(S(choice=["ok"])), end)
    assert not guide.constrains
    for t in tok.encode("free text") + end[:-1]:
        guide.accept(t)
        assert not guide.constrains
    guide.accept(end[-1])
    assert guide.constrains
    assert {tok.decode([t]) for t in allowed_ids(guide)} <= {"o", "ok"}
    for t in tok.encode("ok"):
        guide.accept(t)
    assert guide.finished and guide.error is None


def test_mask_application():
    logits = torch.zeros(3, 40)
    bm = allocate(1, 40)
    bm[0] = 0
    bm[0, 1] = 1 << 2           # token 34 only
    out = apply(logits, [1], bm)
    assert torch.isinf(out[1]).sum() == 39 and out[1, 34] == 0
    assert not torch.isinf(out[0]).any() and not torch.isinf(out[2]).any()


SCHEMA = {"type": "object", "properties": {"a": {"type": "integer", "minimum": 0, "maximum": 99},
                                           "b": {"type": "string", "maxLength": 4}},
          "required": ["a", "b"], "additionalProperties": False}


@pytest.fixture(scope="module")
def llm():
    from g906 import LLM

    with LLM("builtin:tiny-qwen35") as m:
        yield m


def test_offline_api_batch_and_n(llm):
    params = [SamplingParams(max_tokens=200, seed=i, structured_outputs=S(json=SCHEMA, disable_any_whitespace=True))
              for i in range(3)]
    params.append(SamplingParams(n=3, max_tokens=20, seed=7, structured_outputs=S(regex=r"[a-c]{2}-[0-9]{1,3}")))
    params.append(SamplingParams(max_tokens=20, seed=1))               # an unconstrained neighbour
    outs = llm.generate(["a", "b", "c", "d", "e"], params)
    for o in outs[:3]:
        assert o.outputs[0].finish_reason == "stop"
        jsonschema.validate(json.loads(o.outputs[0].text), SCHEMA)
        assert o.outputs[0].text.startswith('{"a":')                  # compact: no free whitespace
    assert len(outs[3].outputs) == 3
    for c in outs[3].outputs:
        assert re.fullmatch(r"[a-c]{2}-[0-9]{1,3}", c.text) and c.finish_reason == "stop"
    assert len(outs[4].outputs[0].token_ids) == 20 or outs[4].outputs[0].finish_reason == "stop"


def test_offline_api_stop_strings_and_choice(llm):
    out = llm.generate(["x"], SamplingParams(max_tokens=30, stop=["-"],
                                             structured_outputs=S(grammar='start: "ab" "-" /[0-9]+/')))[0].outputs[0]
    assert out.text == "ab" and out.finish_reason == "stop" and out.stop_reason == "-"
    out = llm.generate(["x"], SamplingParams(max_tokens=30, structured_outputs=S(choice=["left", "right"])))
    assert out[0].outputs[0].text in ("left", "right")


def test_chat_with_tools_and_a_named_style_constraint(llm, tmp_path):
    """LLM.chat(messages, tools=...): the tools reach the template, string arguments in the
    history are parsed, and structured outputs apply to chat prompts too."""
    from g906 import StructuredOutputsParams

    tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {
        "type": "object", "properties": {"city": {"type": "string"}}}}}]
    history = [{"role": "user", "content": "Paris?"},
               {"role": "assistant", "content": "", "tool_calls": [
                   {"type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
               {"role": "tool", "content": "sunny"}, {"role": "user", "content": "ok?"}]
    out = llm.chat(history, SamplingParams(max_tokens=10, structured_outputs=StructuredOutputsParams(
        choice=["yes", "no"])), tools=tools, chat_template_kwargs={"enable_thinking": False})
    assert "get_weather" in out[0].prompt and "<parameter=city>\nParis\n</parameter>" in out[0].prompt
    assert out[0].outputs[0].text in ("yes", "no")


def test_ignore_eos_and_min_tokens_keep_an_open_grammar_going(grammars, llm):
    guide = Guide(grammars.matcher(S(regex="[ab]*")), None, EOS)
    bm = allocate(2, 434)
    guide.fill(bm, 0)
    guide.fill(bm, 1, allow_eos=False)
    ok = allowed(bm, 434, torch.device("cpu"))
    assert ok[0, EOS].all() and not ok[1, EOS].any() and ok[1].sum() == ok[0].sum() - len(EOS)
    outs = llm.generate(["q"] * 2, [SamplingParams(max_tokens=12, ignore_eos=True, seed=3,
                                                   structured_outputs=S(regex="[ab]*")),
                                    SamplingParams(max_tokens=12, min_tokens=12, seed=4,
                                                   structured_outputs=S(regex="[ab]*"))])
    for o in outs:
        assert len(o.outputs[0].token_ids) == 12 and re.fullmatch("[ab]*", o.outputs[0].text)
    done = Guide(grammars.matcher(S(choice=["a"])), None, EOS)
    done.accept(build_tokenizer().encode("a")[0])
    done.fill(bm, 0, allow_eos=False)     # a complete grammar: the end stays allowed
    assert allowed(bm, 434, torch.device("cpu"))[0, EOS].all()


def test_masks_reach_only_their_rows(llm):
    """A seeded unconstrained request gives the same tokens alone and batched beside constrained
    ones (each row's mask is its own; the others' steps are not pipelined but sample the same)."""
    free = SamplingParams(max_tokens=16, seed=11, ignore_eos=True)
    alone = llm.generate(["neighbour"], free)[0].outputs[0].token_ids
    mixed = llm.generate(["a", "neighbour", "b"], [
        SamplingParams(max_tokens=16, seed=1, structured_outputs=S(regex="[0-9]{16}")), free,
        SamplingParams(max_tokens=16, seed=2, structured_outputs=S(choice=["x" * 5]))])
    assert mixed[1].outputs[0].token_ids == alone
    assert re.fullmatch("[0-9]{16}", mixed[0].outputs[0].text) and mixed[2].outputs[0].text == "xxxxx"
