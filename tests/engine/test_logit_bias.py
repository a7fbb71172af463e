"""logit_bias in the sampler (g906/engine/logit_bias.py) against a reference computed by hand."""

from __future__ import annotations

import pytest
import torch

from g906.engine.logit_bias import apply_logit_bias
from g906.engine.sampler import Sampler, SamplerRow
from g906.engine.sampling_params import SamplingParams


def rows(*biases, **kw):
    return [SamplerRow(key=i, params=SamplingParams(logit_bias=b, **kw)) for i, b in enumerate(biases)]


def test_bias_matches_reference_and_leaves_input():
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 50, generator=g)
    keep = logits.clone()
    out = apply_logit_bias(logits, rows({3: 5.0, 7: -100.0}, None, {49: 0.5}))
    ref = keep.clone()
    ref[0, 3] += 5.0
    ref[0, 7] -= 100.0
    ref[2, 49] += 0.5
    assert torch.equal(out, ref) and torch.equal(logits, keep)
    assert apply_logit_bias(logits, rows(None, {})) is logits


def test_sampler_applies_bias_but_reports_raw_logprobs():
    logits = torch.zeros(2, 10)
    logits[:, 4] = 3.0
    s = Sampler(seed=0)
    ids, lps = s(logits, rows({6: 100.0}, {4: -100.0}, temperature=0.0, logprobs=1))
    assert ids[0] == 6 and ids[1] != 4
    raw = torch.log_softmax(logits[0], -1)
    assert lps[0].logprob == pytest.approx(raw[6].item()) and lps[0].top[0][0] == 4
    ids, _ = s(logits, rows({2: 100.0}, {2: 100.0}, temperature=1.0))
    assert ids == [2, 2]


def test_whole_vocabulary_logprobs():
    logits = torch.randn(1, 12)
    _, lps = Sampler(seed=0)(logits, rows(None, temperature=0.0, logprobs=-1))
    assert len(lps[0].top) == 12


@pytest.mark.parametrize("bias", [{-1: 1.0}, {3: 101.0}, {"3": 1.0}])
def test_bad_bias_is_refused(bias):
    with pytest.raises(ValueError, match="logit_bias"):
        SamplingParams(logit_bias=bias)
