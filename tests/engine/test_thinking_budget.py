"""thinking_token_budget (g906/engine/thinking_budget.py): which token is forced when, and the
sampler obeying it whatever the logits say."""

from __future__ import annotations

import pytest
import torch

from g906.engine.sampler import Sampler, SamplerRow
from g906.engine.sampling_params import SamplingParams
from g906.engine.thinking_budget import forced_token

END = (7, 8)
START = (5,)


def p(budget, *, opened=True):
    return SamplingParams(thinking_token_budget=budget, think_start_ids=START, think_end_ids=END, think_open=opened)


@pytest.mark.parametrize("params,out,want", [
    (p(3), [1, 2], None),               # within the budget
    (p(3), [1, 2, 3], 7),               # spent: the end tag's first id
    (p(3), [1, 2, 3, 7], 8),            # then its second
    (p(3), [1, 2, 3, 7, 8], None),      # closed
    (p(3), [1, 7, 8, 4, 4, 4], None),   # closed by the model itself
    (p(0), [], 7),                      # a zero budget closes at once
    (p(2, opened=False), [1, 1, 1], None),       # no thinking started
    (p(2, opened=False), [1, 5, 2, 3], 7),       # started by the start tag in the output
    (SamplingParams(), [1, 2, 3], None),
])
def test_forced_token(params, out, want):
    assert forced_token(params, out) == want


def test_sampler_forces_the_end_tag():
    logits = torch.zeros(2, 10)
    logits[:, 2] = 50.0                 # the model wants token 2 everywhere
    rows = [SamplerRow(key=0, params=p(2), output_token_ids=[2, 2]),
            SamplerRow(key=1, params=SamplingParams(temperature=1.0, seed=1, thinking_token_budget=2,
                                                    think_end_ids=END, think_open=True), output_token_ids=[2, 2, 7])]
    ids, _ = Sampler(seed=0)(logits, rows)
    assert ids == [7, 8]
    with pytest.raises(ValueError, match="thinking_token_budget"):
        SamplingParams(thinking_token_budget=-1)
