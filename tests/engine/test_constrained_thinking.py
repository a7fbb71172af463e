"""A constrained answer always arrives (g906/engine/constrained_thinking.py): inside the thinking
of a request whose constraint waits for `</think>`, a token that would end the request becomes
the end tag exactly where it was sampled, and the grammar's answer follows; requests without a
pending constraint still stop. The sampler's rule alone (greedy, seeded sampling, the filters,
min_tokens, ignore_eos, stop_token_ids, a tag of several tokens, the verify distribution), then
the offline API on the builtin model (greedy, seeded, n > 1)."""

from __future__ import annotations

import json
import re

import pytest
import torch

from g906.engine.constrained_thinking import continuation, with_end_tag
from g906.engine.sampler import Sampler, SamplerRow
from g906.engine.sampling_params import SamplingParams
from g906.engine.structured import StructuredOutputsParams as S

V, EOS, END = 12, 11, 7
WAITS = S(regex="a", after="</think>")


def p(**kw):
    kw.setdefault("structured_outputs", WAITS)
    kw.setdefault("think_end_ids", (END,))
    return SamplingParams(**kw)


def wants(token: int, rows: int = 1, second: int | None = None) -> torch.Tensor:
    logits = torch.zeros(rows, V)
    logits[:, token] = 20.0
    if second is not None:
        logits[:, second] = 19.0
    return logits


@pytest.mark.parametrize("params,out,want", [
    (p(temperature=0.0), [1, 2], END),                       # a thinking greedy row: the tag
    (SamplingParams(temperature=0.0), [1, 2], EOS),          # unconstrained: it stops
    (p(temperature=0.0, structured_outputs=S(regex="a")), [1], EOS),   # no thinking to close
    (p(temperature=0.0), [1, END, 2], EOS),                  # closed: the grammar decides (no mask here)
    (p(temperature=0.0, ignore_eos=True), [1], EOS),         # not a stop then
    (p(temperature=0.0, min_tokens=4), [1, 2], EOS),         # before min_tokens it does not end the request
    (p(temperature=0.0, min_tokens=3), [1, 2], END),         # the 3rd token would end it
    (p(temperature=1.0, seed=3, top_k=1), [1], END),         # sampled: the drawn stop replaced
    (p(temperature=0.7, seed=3, stop_token_ids=[4]), [], END),    # a stop_token_id (the model wants 4)
])
def test_the_rule_per_row(params, out, want):
    logits = wants(4 if params.stop_token_ids else EOS)
    ids, _ = Sampler(seed=0, eos_token_ids=[EOS])(logits, [SamplerRow(0, params, output_token_ids=out)])
    assert ids == [want]


def test_a_token_that_is_not_a_stop_is_untouched_and_the_logprob_is_the_emitted_tokens():
    s = Sampler(seed=0, eos_token_ids=[EOS])
    ids, _ = s(wants(3, 2, second=EOS), [SamplerRow(0, p(temperature=0.0), output_token_ids=[]),
                                        SamplerRow(1, p(temperature=1.0, seed=1, top_k=1), output_token_ids=[])])
    assert ids == [3, 3]
    logits = wants(EOS)
    ids, lps = s(logits, [SamplerRow(0, p(temperature=0.0, logprobs=1), output_token_ids=[])])
    assert ids == [END] and lps[0].token_id == END
    assert lps[0].logprob == pytest.approx(float(torch.log_softmax(logits[0], -1)[END]))


def test_seeded_draws_before_the_stop_are_the_unconstrained_ones():
    """A seeded row draws what it would draw without the rule; only a drawn stop changes."""
    torch.manual_seed(0)
    logits = torch.randn(1, V)
    logits[0, EOS] += 1.5
    free, ruled = [], []
    for name, params, got in (("free", SamplingParams(temperature=1.0, seed=5, ignore_eos=True), free),
                              ("ruled", p(temperature=1.0, seed=5), ruled)):
        s = Sampler(seed=0, eos_token_ids=[EOS])
        for _ in range(60):
            got.append(s(logits, [SamplerRow(9, params, output_token_ids=[1])])[0][0])
    assert EOS in free
    assert ruled == [END if t == EOS else t for t in free]


def test_sampled_frequencies_and_the_verify_distribution():
    """Drawing then replacing: the tag's frequency is p(tag) + p(stops); distribution() (what
    speculative verification samples from) moves the stops' mass onto the tag after the filters."""
    logits = torch.log(torch.tensor([[0.3, 0.05, 0.05, 0.05, 0.05, 0.05, 0.05, 0.1, 0.05, 0.05, 0.05, 0.15]]))
    n = 4000
    rows = [SamplerRow(i, p(temperature=1.0, seed=i, stop_token_ids=[0]), output_token_ids=[2]) for i in range(n)]
    ids, _ = Sampler(seed=0, eos_token_ids=[EOS])(logits.expand(n, V).contiguous(), rows)
    counts = torch.bincount(torch.tensor(ids), minlength=V).float() / n
    assert counts[EOS] == 0 and counts[0] == 0
    assert abs(float(counts[END]) - 0.55) < 0.04
    s = Sampler(seed=0, eos_token_ids=[EOS])
    _, probs = s.distribution(logits, [SamplerRow(0, p(temperature=1.0, stop_token_ids=[0]), output_token_ids=[2])])
    assert float(probs[0, END]) == pytest.approx(0.55) and float(probs[0, 0]) == float(probs[0, EOS]) == 0.0
    _, probs = s.distribution(logits, [SamplerRow(0, p(temperature=1.0, top_k=2), output_token_ids=[2])])
    assert float(probs[0, END]) == pytest.approx(0.15 / 0.45) and float(probs[0, 0]) == pytest.approx(0.3 / 0.45)
    x, probs = s.distribution(logits, [SamplerRow(0, p(temperature=0.0, stop_token_ids=[0]), output_token_ids=[2])])
    assert probs is None and int(x.argmax()) == END


def test_an_end_tag_of_several_tokens_is_completed():
    two = p(temperature=0.0, think_end_ids=(5, 6))
    assert continuation(two, [1, 5]) == 6 and continuation(two, [1, 2]) is None
    assert continuation(two, [5, 6, 5]) is None                 # closed already
    s = Sampler(seed=0, eos_token_ids=[EOS])
    assert s(wants(EOS), [SamplerRow(0, two, output_token_ids=[1])])[0] == [5]
    assert s(wants(EOS), [SamplerRow(0, two, output_token_ids=[1, 5])])[0] == [6]
    assert s(wants(EOS), [SamplerRow(0, two, output_token_ids=[1, 5, 6])])[0] == [EOS]


def test_with_end_tag_fills_and_checks_the_ids():
    enc = {"</think>": [END]}.__getitem__
    assert with_end_tag(SamplingParams(structured_outputs=WAITS), enc).think_end_ids == (END,)
    assert with_end_tag(SamplingParams(structured_outputs=S(regex="a")), enc).think_end_ids == ()
    with pytest.raises(ValueError, match="think_end_ids"):
        with_end_tag(SamplingParams(structured_outputs=WAITS, think_end_ids=(3,)), enc)
    with pytest.raises(ValueError, match="think_end_ids"):
        SamplingParams(think_end_ids=(-1,))


# -- the offline API on the builtin model ------------------------------------------------------------
PATTERN = r"[a-d]{3,6}x"


@pytest.fixture(scope="module")
def llm():
    from g906.engine.llm import LLM

    with LLM("builtin:tiny-qwen35") as m:
        yield m


def _ids(llm, params, prompt="think about it"):
    return llm.generate([prompt], params)[0].outputs


@pytest.mark.parametrize("sampling", [dict(temperature=0.0), dict(temperature=1.0, seed=7)], ids=["greedy", "seeded"])
def test_a_stop_inside_the_thinking_becomes_the_end_tag_then_the_answer(llm, sampling):
    """The unconstrained output's 4th token made a stop token: without a constraint the request
    stops there; with one waiting for </think>, </think> stands in its place and a grammar-valid
    answer follows."""
    tok = llm.engine.tokenizer
    end = tok.encode("</think>")
    free = _ids(llm, SamplingParams(max_tokens=8, ignore_eos=True, **sampling))[0].token_ids
    k = next(i for i in range(3, 8) if free[i] not in free[:i] + end)
    stop = dict(stop_token_ids=[free[k]], max_tokens=60, **sampling)
    plain = _ids(llm, SamplingParams(**stop))[0]
    assert plain.token_ids == free[:k] + [free[k]] or plain.token_ids == free[:k]
    assert plain.finish_reason == "stop"
    out = _ids(llm, SamplingParams(**stop, structured_outputs=S(regex=PATTERN, after="</think>")))[0]
    assert out.token_ids[:k + 1] == free[:k] + end
    assert re.fullmatch(PATTERN, tok.decode([t for t in out.token_ids[k + 1:] if t not in llm.engine.eos_token_ids]))
    assert out.finish_reason == "stop"


def test_end_of_sequence_inside_the_thinking_with_n_samples(llm):
    """An end token the model is pushed to sample at once: every sample of a constrained request
    closes its thinking and answers, the unconstrained one ends empty."""
    tok = llm.engine.tokenizer
    end = tok.encode("</think>")
    bias = {t: 30.0 for t in llm.engine.eos_token_ids}
    outs = _ids(llm, SamplingParams(n=3, temperature=1.0, seed=2, max_tokens=40, logit_bias=bias,
                                    structured_outputs=S(json={"type": "object", "properties": {
                                        "a": {"type": "integer", "minimum": 0, "maximum": 9}},
                                        "required": ["a"], "additionalProperties": False}, disable_any_whitespace=True,
                                        after="</think>")))
    for o in outs:
        assert o.token_ids[:1] == end and o.finish_reason == "stop"
        assert 0 <= json.loads(tok.decode([t for t in o.token_ids[1:] if t not in bias]))["a"] <= 9
    plain = _ids(llm, SamplingParams(temperature=1.0, seed=2, max_tokens=40, logit_bias=bias))[0]
    assert plain.finish_reason == "stop" and plain.text == ""
