"""benchmarks/moe_placement.py: the per-rank expert bytes of g906's MoE placement (experts split
by features) against expert parallelism, the numbers docs/parallel.md gives for not offering EP."""

from __future__ import annotations

import json

import pytest

from tests.benchmark_scripts import load_benchmark


@pytest.fixture(scope="module")
def mp():
    return load_benchmark("moe_placement")


def test_one_token_imbalance_is_the_hypergeometric_mean(mp):
    exact = mp.slowest_share_one_token(256, 8, 2)
    assert exact == pytest.approx(5.0765, abs=1e-4)          # vs 4 experts a rank when split by features
    assert mp.slowest_share(256, 8, 2, 1, samples=4000) == pytest.approx(exact, abs=0.06)
    # 4 experts, top-2: 2 of the 6 pairs fall on one rank (2 experts there), 4 split 1 + 1
    assert mp.slowest_share_one_token(4, 2, 2) == pytest.approx((2 * 2 + 4 * 1) / 6)


def test_expert_parallel_reads_more_on_the_slowest_rank(mp, capsys):
    assert mp.main(["--json", "--batch", "1,4"]) == 0
    res = json.loads(capsys.readouterr().out)
    assert res["expert_bytes"] == 3 * 512 * 2048 * 4.5 / 8
    one, four = res["rows"]
    assert one["split_experts_per_rank"] == 4.0 and one["ep_over_split"] == pytest.approx(1.239, abs=2e-3)
    assert 1.0 < four["ep_over_split"] < one["ep_over_split"]   # batches balance better, never past split
    assert one["all_reduce_bytes_per_step"] == 40 * 2048 * 2 and one["all_reduces_per_step"] == 40


def test_bad_arguments(mp, capsys):
    with pytest.raises(SystemExit) as exc:
        mp.main(["--shape", "qwen3.5-9b"])
    assert exc.value.code == 2 and "not an MoE shape" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        mp.main(["--ranks", "3"])
    assert "dividing the 256 experts" in capsys.readouterr().err
