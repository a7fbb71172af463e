"""Speculative decoding with the sampling that a verify step must reproduce per position:
structured outputs (the grammar's mask after the drafts before each position; the matcher ends
after the emitted tokens only), logit bias and the thinking budget's forced end tag. Greedy
outputs with MTP (k = 1, 2, 3) and n-gram equal those without speculation token for token while
the draft counters move; sampled constrained outputs follow the masked target distribution
(chi-square against transformers); Guide.speculate / mask_after leave the matcher as they found
it."""

from __future__ import annotations

import json
import re

import pytest
import torch

from g906.engine.sampling_params import SamplingParams
from g906.engine.structured import StructuredOutputsParams as S
from g906.engine.structured.mask import allocate, allowed

from .conftest import random_prompt
from .spec_models import MARKOV_EOS, chi2_sf, chi_square, load_mtp, markov_mtp_dir, run

pytestmark = pytest.mark.usefixtures("torch_one_thread")

PROMPTS = [random_prompt(5, 1), random_prompt(23, 2), random_prompt(40, 3), random_prompt(9, 4), random_prompt(14, 5)]
MTP = [{"method": "mtp", "num_speculative_tokens": k} for k in (1, 2, 3)]
NGRAM = {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_min": 1, "prompt_lookup_max": 3}
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "string", "maxLength": 6}},
          "required": ["a", "b"], "additionalProperties": False}
EOS = MARKOV_EOS


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The speculative tests' Markov model (MTP block included) with an end token its tokenizer
    has, so that llguidance can offer it."""
    return markov_mtp_dir(tmp_path_factory.mktemp("spec-structured"), eos_token_id=EOS)


@pytest.fixture(scope="module")
def loaded(model_dir):
    return load_mtp(model_dir)


def constrained_params(max_tokens=28):
    g = dict(temperature=0.0, max_tokens=max_tokens)
    return [SamplingParams(**g, structured_outputs=S(json=SCHEMA, disable_any_whitespace=True)),
            SamplingParams(**g, structured_outputs=S(regex="(ab|cd)+[0-9]{3,6}")),
            SamplingParams(**g, structured_outputs=S(choice=["alpha", "beta gamma", "delta"])),
            SamplingParams(**g, ignore_eos=True),                     # an unconstrained neighbour
            # logprobs: no drafts, one plain position per verify step, masked by the plain sampler
            SamplingParams(**g, logprobs=1, structured_outputs=S(regex="[0-9]{4,8}z"))]


@pytest.mark.parametrize("spec", MTP + [NGRAM], ids=["mtp1", "mtp2", "mtp3", "ngram"])
def test_constrained_greedy_equals_no_speculation(loaded, spec):
    params = constrained_params()
    ref, _ = run(loaded, PROMPTS, params)
    got, eng = run(loaded, PROMPTS, params, spec)
    assert got == ref
    st = eng.stats()
    assert st["spec_num_draft_tokens"] > 0, st
    if spec["method"] == "mtp":            # (n-gram lookups rarely hit on these random prompts)
        assert st["spec_num_accepted_tokens"] > 0, st
    tok = loaded.tokenizer
    json.loads(tok.decode([t for t in ref[0] if t != EOS]))      # the schema's object, complete
    assert re.fullmatch(r"(ab|cd)+[0-9]{3,6}", tok.decode([t for t in ref[1] if t != EOS]))
    assert tok.decode(ref[2]) in ("alpha", "beta gamma", "delta")
    assert re.fullmatch(r"[0-9]{4,8}z", tok.decode([t for t in ref[4] if t != EOS]))


def test_mtp_drafts_stay_inside_the_grammar(loaded, monkeypatch):
    """The MTP drafter is masked like the target: with a grammar whose every token is forced or
    nearly so, nearly every draft is accepted; the verify step reuses the drafter's masks (one
    new mask per verify row, for the position after the last draft)."""
    from g906.engine.structured.guide import Guide

    params = [SamplingParams(temperature=0.0, max_tokens=40,
                             structured_outputs=S(regex="(hello world ){3}done"))]
    ref, _ = run(loaded, PROMPTS[:1], params)
    fills = []
    fill = Guide.fill
    monkeypatch.setattr(Guide, "fill", lambda self, *a, **kw: (fills.append(1), fill(self, *a, **kw))[1])
    got, eng = run(loaded, PROMPTS[:1], params, MTP[2])
    assert got == ref and loaded.tokenizer.decode(ref[0]).startswith("hello world hello world")
    st = eng.stats()
    assert st["spec_num_accepted_tokens"] >= 0.9 * st["spec_num_draft_tokens"] > 0, st
    # the drafter's masks (at most one per draft) and one per verify row, plus the first token's
    assert len(fills) <= st["spec_num_draft_tokens"] + st["spec_num_drafts"] + 4, (len(fills), st)


def test_constraint_after_a_marker_and_logit_bias(loaded):
    """The constraint starts after "</think>" (which a logit bias pushes the model to write at
    once): the drafts cross the marker, the bias applies at every verify position, and the mask
    keeps the biased token out after it."""
    end = loaded.tokenizer.encode("</think>")
    assert len(end) == 1
    g = dict(temperature=0.0, max_tokens=20, logit_bias={end[0]: 100.0})
    params = [SamplingParams(**g, structured_outputs=S(regex="[a-d]{3,9}x", after="</think>")),
              SamplingParams(**g, ignore_eos=True)]
    ref, _ = run(loaded, PROMPTS[:2], params)
    assert ref[0][0] == end[0] and end[0] not in ref[0][1:] and ref[1] == end * 20
    assert re.fullmatch(r"[a-d]{3,9}x", loaded.tokenizer.decode([t for t in ref[0][1:] if t != EOS]))
    for spec in (MTP[2], NGRAM):
        got, eng = run(loaded, PROMPTS[:2], params, spec)
        assert got == ref, spec
        assert eng.stats()["spec_num_accepted_tokens"] > 0


def test_thinking_budget_under_speculation(loaded):
    """The forced end tag lands at the budget's position within a verify step's drafts."""
    end = tuple(loaded.tokenizer.encode("\n</think>\n"))
    assert len(end) > 1
    params = [SamplingParams(temperature=0.0, max_tokens=16, ignore_eos=True, thinking_token_budget=b,
                             think_start_ids=(), think_end_ids=end, think_open=True) for b in (2, 5, 7)]
    ref, _ = run(loaded, PROMPTS[:3], params)
    for r, b in zip(ref, (2, 5, 7)):
        assert tuple(r[b: b + len(end)]) == end
    for spec in (MTP[0], MTP[2], NGRAM):
        got, eng = run(loaded, PROMPTS[:3], params, spec)
        assert got == ref, spec
        assert eng.stats()["spec_num_draft_tokens"] > 0


def test_constrained_seeded_sampling_is_reproducible(loaded):
    """Seeded constrained requests under speculation: the same tokens run after run, and a
    request alone gives what it gives in a batch (its own generator, its own masks)."""
    params = [SamplingParams(temperature=0.9, top_p=0.95, max_tokens=20, seed=11 + i, structured_outputs=c)
              for i, c in enumerate([S(regex="[a-f]{2,12}[0-9]"), S(json=SCHEMA), S(choice=["red", "green", "blue"])])]
    a, eng = run(loaded, PROMPTS[:3], params, MTP[2])
    b, _ = run(loaded, PROMPTS[:3], params, MTP[2])
    assert a == b and eng.stats()["spec_num_draft_tokens"] > 0
    alone, _ = run(loaded, PROMPTS[1:2], params[1:2], MTP[2])
    assert alone == a[1:2]
    assert re.fullmatch(r"[a-f]{2,12}[0-9]", loaded.tokenizer.decode([t for t in a[0] if t != EOS]))


def test_constrained_sampling_follows_the_masked_target(loaded, model_dir):
    """1000 seeded requests under a regex, MTP k = 2: the joint distribution of the outputs
    matches transformers' model restricted at each step to the grammar's mask (chi-square),
    while drafts are both accepted and rejected."""
    from transformers import Qwen3_5ForCausalLM

    from g906.engine.structured.grammar import GrammarCompiler

    spec = S(regex="[xyz]{3}")
    prompt = PROMPTS[0]
    n = 1000
    params = [SamplingParams(temperature=1.0, max_tokens=6, seed=i, structured_outputs=spec) for i in range(n)]
    got, eng = run(loaded, [prompt] * n, params, MTP[1], max_num_seqs=64, num_kv_blocks=300,
                   max_num_batched_tokens=512)
    st = eng.stats()
    assert 0 < st["spec_num_accepted_tokens"] < st["spec_num_draft_tokens"], st

    hf = Qwen3_5ForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    grammars = GrammarCompiler(loaded.tokenizer, loaded.config.vocab_size, [EOS])
    vocab = loaded.config.vocab_size
    exact: dict = {}

    @torch.no_grad()
    def walk(out: list[int], p: float) -> None:
        m = grammars.matcher(spec)
        assert m.consume_tokens(out) if out else True
        if m.is_stopped():
            exact[tuple(out)] = exact.get(tuple(out), 0.0) + p
            return
        bm = allocate(1, vocab)
        m.unsafe_compute_mask_ptr(bm[0].data_ptr(), bm[0].numel() * 4)
        ok = allowed(bm, vocab, torch.device("cpu"))[0]
        logits = hf(torch.tensor([prompt + out])).logits[0, -1].masked_fill(~ok, float("-inf"))
        probs = torch.softmax(logits, -1)
        for t in ok.nonzero()[:, 0].tolist():
            if t == EOS:
                exact[tuple(out + [t])] = exact.get(tuple(out + [t]), 0.0) + p * float(probs[t])
            else:
                walk(out + [t], p * float(probs[t]))

    walk([], 1.0)
    stat, cells = chi_square(got, exact, n)
    assert cells > 4
    p = chi2_sf(stat, cells - 1)
    assert p > 1e-3, (stat, cells, p)


def test_guide_speculate_leaves_the_matcher_unchanged():
    from g906.engine.builtin import build_tokenizer
    from g906.engine.structured.grammar import GrammarCompiler
    from g906.engine.structured.guide import Guide

    tok = build_tokenizer()
    grammars = GrammarCompiler(tok, 434, [427])
    guide = Guide(grammars.matcher(S(choice=["yes", "no"])), eos_ids=[427])

    def mask_now():
        bm = allocate(1, 434)
        guide.fill(bm, 0)
        return bm.clone()

    before = mask_now()
    yes, no = tok.encode("yes"), tok.encode("no")
    bm = allocate(8, 434)
    # every draft allowed, the last one completes the grammar: the drafts stop there
    n, flags = guide.speculate(yes + [5], bm, 0, [True] * (len(yes) + 2))
    assert n == len(yes) and flags == [True] * len(yes) + [False]
    assert torch.equal(bm[0], before[0])
    # a forbidden draft ends the drafts before it
    n, flags = guide.speculate([yes[0], no[-1]], bm, 0, [True] * 3)
    assert n == 1 and flags == [True, True]
    assert torch.equal(mask_now(), before) and not guide.matcher.is_error()
    assert guide.mask_after(yes[:1], bm, 3) and not guide.mask_after(yes, bm, 4)
    assert torch.equal(mask_now(), before)
    for t in yes:
        guide.accept(t)
    assert guide.finished and not guide.matcher.is_error()


def test_a_stop_inside_a_constrained_thinking_under_speculation(loaded, monkeypatch):
    """A constrained request's stop token inside its thinking becomes </think> (then the grammar's
    answer) at the same place with and without speculation, greedy; the verify step's drafts
    cross it. Seeded sampled requests under speculation close their thinking and answer too."""
    end = loaded.tokenizer.encode("</think>")
    free, _ = run(loaded, PROMPTS[:2], [SamplingParams(temperature=0.0, max_tokens=10, ignore_eos=True)] * 2)
    ks = [next(i for i in range(3, 10) if f[i] not in f[:i] + end + [EOS]) for f in free]
    regex = "[a-d]{3,9}x"
    params = [SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[f[k]],
                             structured_outputs=S(regex=regex, after="</think>")) for f, k in zip(free, ks)]
    params.append(SamplingParams(temperature=0.0, max_tokens=30, stop_token_ids=[free[0][ks[0]]]))
    ref, _ = run(loaded, PROMPTS[:2] + PROMPTS[:1], params)
    for r, f, k in zip(ref, free, ks):
        assert r[:k + 1] == f[:k] + end
        assert re.fullmatch(regex, loaded.tokenizer.decode([t for t in r[k + 1:] if t != EOS]))
    assert ref[2] in (free[0][:ks[0]], free[0][:ks[0] + 1])      # unconstrained: it stopped there
    for spec in (MTP[2], NGRAM):
        got, eng = run(loaded, PROMPTS[:2] + PROMPTS[:1], params, spec)
        assert got == ref, spec
        assert eng.stats()["spec_num_draft_tokens"] > 0
    # the MTP drafter applies the rule too: it drafts </think> where the target will close, never the stop
    from g906.engine.spec.decoder import SpecDecoder

    drafted, inner = [], SpecDecoder._draft_tokens

    def recording(self, logits, seqs, drafts):
        toks = inner(self, logits, seqs, drafts)
        drafted.extend((s.params, s.output_token_ids + drafts.get(s.seq_id, []), t)
                       for s, t in zip(seqs, toks.tolist()))
        return toks

    monkeypatch.setattr(SpecDecoder, "_draft_tokens", recording)
    assert run(loaded, PROMPTS[:2] + PROMPTS[:1], params, MTP[2])[0] == ref
    closing = [(p, out, t) for p, out, t in drafted if p.answer_after_thinking and end[0] not in out]
    assert closing and not any(t in p.stop_token_ids for p, _, t in closing)
    assert any(t == end[0] for _, _, t in closing)
    sampled = [SamplingParams(temperature=1.0, seed=s, max_tokens=40, logit_bias={EOS: 4.0},
                              structured_outputs=S(regex=regex, after="</think>")) for s in range(4)]
    got, eng = run(loaded, PROMPTS[:4], sampled, MTP[2])
    assert eng.stats()["spec_num_draft_tokens"] > 0
    for g in got:
        assert end[0] in g
        assert re.fullmatch(regex, loaded.tokenizer.decode([t for t in g[g.index(end[0]) + 1:] if t != EOS]))
