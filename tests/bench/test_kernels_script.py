"""benchmarks/kernel_bench.py's linear-quant sweep: its extra configs name the field decodes, so the
packed-fp16 default and the fp32 fields are timed side by side, and its labels say which ran."""

from __future__ import annotations

import pytest
import torch

from g906.kernels._triton_util import is_rocm
from tests.benchmark_scripts import load_benchmark


@pytest.mark.skipif(is_rocm(), reason="ROCm keeps the fp32 fields (no packed fp16 default)")
def test_linear_quant_sweep_times_both_field_decodes():
    kb = load_benchmark("kernel_bench")
    from g906.kernels.linear import packed_config as K

    x = torch.zeros(1, 4096, dtype=torch.float16)
    for qt, fp32_fields in (("Q4_K", {0, 1, 2}), ("Q5_K", {1})):
        base = K._pq_gemv_config(1, 8192, 4096, qt, x.device)
        assert kb._run_pairs(x, qt, base, {}) == 3                  # the default: packed fp16
        extra = kb.linq_extra(qt, base)
        assert {c["PAIRS"] for c in extra} == fp32_fields           # each named: runs as asked
        assert all(kb._run_pairs(x, qt, base, c) == c["PAIRS"] for c in extra)
        for rows, label in ((8, "8/1/False/p3"), (4, "4/1/False")):     # 4 rows: fp32 fields
            grid = dict(BLOCK_N=rows, num_warps=1, PREFETCH=False)
            assert kb.sweep_label(grid, kb._run_pairs(x, qt, base, grid)) == label
        assert not kb.sweep_label(extra[0], kb._run_pairs(x, qt, base, extra[0])).endswith("p3")
    q6 = K._pq_gemv_config(1, 8192, 4096, "Q6_K", x.device)
    grid = dict(BLOCK_N=4, num_warps=1, PREFETCH=False)
    assert kb.sweep_label(grid, kb._run_pairs(x, "Q6_K", q6, grid)) == "4/1/False"
    lm = K._pq_gemv_config(1, 248320, 4096, "Q6_K", x.device)      # 8 rows: packed fp16
    assert kb._run_pairs(x, "Q6_K", lm, {}) == 3
    assert [kb._run_pairs(x, "Q6_K", lm, c) for c in kb.linq_extra("Q6_K", lm)] == [1]
