import math

import pytest
import torch

from g906.engine.sampler import Sampler, SamplerRow
from g906.engine.sampling_params import SamplingParams
from g906.engine.stop import StopStrings, token_stop


def rows(*params, **kw):
    return [SamplerRow(key=i, params=p, **kw) for i, p in enumerate(params)]


def test_greedy_is_argmax_and_independent_of_batch():
    torch.manual_seed(0)
    logits = torch.randn(5, 50)
    s = Sampler(seed=0)
    ids, _ = s(logits, rows(*[SamplingParams(temperature=0)] * 5))
    assert ids == logits.argmax(-1).tolist()
    one, _ = s(logits[2:3], rows(SamplingParams(temperature=0)))
    assert one == [ids[2]]


def test_precomputed_argmax_serves_greedy_rows_only_without_penalties():
    """The decode graphs pass their in-graph argmax: greedy rows take it as is (a marker value
    here shows it is used, not recomputed); with a penalty the logits change and it is ignored."""
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5], [0.0, 0.1, 3.0, 0.2]])
    s = Sampler(seed=0)
    marker = torch.tensor([3, 1])
    ids, _ = s.launch(logits, rows(*[SamplingParams(temperature=0)] * 2), argmax=marker).result()
    assert ids == [3, 1]
    mixed = [SamplerRow(0, SamplingParams(temperature=0)), SamplerRow(1, SamplingParams(temperature=1.0, seed=3))]
    ids, _ = s.launch(logits, mixed, argmax=marker).result()
    assert ids[0] == 3
    pen = rows(SamplingParams(temperature=0, presence_penalty=1.0), SamplingParams(temperature=0),
               output_token_ids=[0])
    ids, _ = s.launch(logits, pen, argmax=marker).result()
    assert ids == [1, 2]                          # recomputed from the penalised logits
    sampled = rows(SamplingParams(temperature=1.0, seed=1), SamplingParams(temperature=1.0, seed=2))
    with_marker = Sampler(seed=0).launch(logits, sampled, argmax=marker).result()[0]
    assert Sampler(seed=0).launch(logits, sampled).result()[0] == with_marker   # unused there


def test_seeded_sampling_reproducible_whatever_the_batch():
    torch.manual_seed(1)
    logits = torch.randn(3, 100)
    p = SamplingParams(temperature=1.0, seed=42)
    a = [Sampler()(logits[1:2], [SamplerRow(7, p)])[0][0] for _ in range(3)]
    assert len(set(a)) == 1
    s1 = Sampler()
    seq1 = [s1(logits[1:2], [SamplerRow(7, p)])[0][0] for _ in range(20)]
    s2 = Sampler()
    other = SamplingParams(temperature=0.8)
    seq2 = [s2(logits, [SamplerRow(1, other), SamplerRow(7, p), SamplerRow(2, other)])[0][1] for _ in range(20)]
    assert seq1 == seq2
    assert len(set(seq1)) > 1  # it really samples


def test_top_k_top_p_min_p_restrict_support():
    logits = torch.tensor([[5.0, 4.0, 3.0, 0.0, -1.0, -2.0]])
    s = Sampler(seed=0)
    for params, allowed in [
        (SamplingParams(temperature=1.0, top_k=2), {0, 1}),
        (SamplingParams(temperature=1.0, top_p=0.5), {0}),
        (SamplingParams(temperature=1.0, top_p=0.8), {0, 1}),
        (SamplingParams(temperature=1.0, min_p=0.3), {0, 1}),
    ]:
        seen = {s(logits, rows(params))[0][0] for _ in range(200)}
        assert seen <= allowed and seen, (params, seen)
    seen = {s(logits, rows(SamplingParams(temperature=5.0)))[0][0] for _ in range(300)}
    assert len(seen) >= 5


def test_penalties():
    logits = torch.tensor([[2.0, 1.9, -1.0, 0.5]])
    s = Sampler()
    # token 0 was generated: a presence penalty of 1 moves the argmax to token 1
    ids, _ = s(logits, rows(SamplingParams(temperature=0, presence_penalty=1.0), output_token_ids=[0]))
    assert ids == [1]
    ids, _ = s(logits, rows(SamplingParams(temperature=0, frequency_penalty=0.06), output_token_ids=[0, 0]))
    assert ids == [1]
    ids, _ = s(logits, rows(SamplingParams(temperature=0, frequency_penalty=0.06), output_token_ids=[0]))
    assert ids == [0]
    # repetition penalty covers the prompt too: 2.0 / 1.1 < 1.9
    ids, _ = s(logits, rows(SamplingParams(temperature=0, repetition_penalty=1.1), prompt_token_ids=[0], output_token_ids=[]))
    assert ids == [1]
    # rows without penalties are untouched in a mixed batch
    both = torch.cat([logits, logits])
    r = [SamplerRow(0, SamplingParams(temperature=0, presence_penalty=1.0), [], [0]), SamplerRow(1, SamplingParams(temperature=0))]
    assert s(both, r)[0] == [1, 0]


def test_logprobs_are_raw_and_ranked():
    logits = torch.tensor([[1.0, 3.0, 2.0, 0.0]])
    s = Sampler()
    ids, lps = s(logits, rows(SamplingParams(temperature=0, logprobs=2, presence_penalty=0.0)))
    ref = torch.log_softmax(logits, -1)[0]
    lp = lps[0]
    assert ids == [1] and lp.token_id == 1 and lp.rank == 1
    assert math.isclose(lp.logprob, ref[1].item(), rel_tol=1e-6)
    assert [t for t, _ in lp.top] == [1, 2]
    ids, lps = s(logits, rows(SamplingParams(temperature=0, logprobs=0)))
    assert lps[0].top == []
    ids, lps = s(logits, rows(SamplingParams(temperature=0)))
    assert lps == [None]


def test_params_validation_names_the_field():
    for kw in [dict(temperature=-1), dict(top_p=0), dict(top_k=-2), dict(min_p=2), dict(n=0),
               dict(max_tokens=0), dict(logprobs=21), dict(presence_penalty=3), dict(stop=[""])]:
        with pytest.raises(ValueError) as e:
            SamplingParams(**kw)
        assert list(kw)[0] in str(e.value)
    p = SamplingParams(stop="x", top_k=-1, seed=3, n=2)
    assert p.stop == ["x"] and p.top_k == 0
    assert p.for_child(1).seed == 4 and p.for_child(1).n == 1


# -- stop handling ------------------------------------------------------------------------------

def feed_all(st, pieces):
    return [st.feed(p) for p in pieces]


def test_stop_string_split_across_tokens_never_leaks():
    st = StopStrings(["STOP"])
    out = feed_all(st, ["Hello S", "T", "O", "P and more"])
    assert "".join(out) == "Hello " and st.matched == "STOP"
    assert st.feed("later") == ""


def test_held_back_prefix_released_when_it_does_not_match():
    st = StopStrings(["abc"])
    assert st.feed("xab") == "x"
    assert st.feed("d") == "abd"
    assert st.flush() == ""
    st = StopStrings(["abc"])
    assert st.feed("za") == "z"
    assert st.flush() == "a"


def test_earliest_stop_wins_and_include_stop():
    st = StopStrings(["world", "lo"])
    assert st.feed("hello world") == "hel" and st.matched == "lo"
    st = StopStrings(["\n\n"], include_stop=True)
    assert "".join(feed_all(st, ["a\n", "\nb"])) == "a\n\n"


def test_token_stop_reasons():
    p = SamplingParams(max_tokens=3)
    assert token_stop(p, 9, 1, 10, {9}, 100) == ("stop", 9)
    assert token_stop(SamplingParams(ignore_eos=True, max_tokens=3), 9, 1, 10, {9}, 100) == (None, None)
    assert token_stop(p, 5, 3, 10, {9}, 100) == ("length", None)
    assert token_stop(SamplingParams(max_tokens=None), 5, 3, 100, {9}, 100) == ("length", None)
    assert token_stop(SamplingParams(stop_token_ids=[5]), 5, 1, 10, set(), 100) == ("stop", 5)
    assert token_stop(SamplingParams(min_tokens=2), 9, 1, 10, {9}, 100) == (None, None)
