"""g906/server/request_metrics.py: vLLM's per-request metric definitions over an engine timeline."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from g906.server.request_metrics import Timeline, request_metrics


def choice(n, **times):
    return SimpleNamespace(timeline=Timeline(**times), num_tokens=n)


def test_definitions():
    c = choice(5, arrival=10.0, scheduled=10.5, first_token=11.0, last_token=13.0)
    m = request_metrics([c], True)
    assert m == pytest.approx({"queue_time_ms": 500.0, "time_to_first_token_ms": 500.0,
                               "generation_time_ms": 2000.0, "mean_itl_ms": 500.0,
                               "tokens_per_second": 5 / 2.5})


def test_one_token_has_no_inter_token_latency_and_unknown_times_are_left_out():
    m = request_metrics([choice(1, arrival=1.0, scheduled=1.25, first_token=2.0, last_token=2.0)], True)
    assert "mean_itl_ms" not in m and m["generation_time_ms"] == 0.0 and m["tokens_per_second"] == pytest.approx(1 / 0.75)
    assert request_metrics([choice(3, first_token=2.0, last_token=3.0)], True) == {
        "generation_time_ms": 1000.0, "mean_itl_ms": 500.0}


def test_off_or_several_choices_is_none():
    c = choice(2, arrival=1.0, scheduled=1.0, first_token=1.0, last_token=2.0)
    assert request_metrics([c], False) is None
    assert request_metrics([c, c], True) is None


def test_timeline_records_the_engine_times():
    t = Timeline()
    out = SimpleNamespace(arrival_at=1.0, scheduled_at=2.0, first_token_at=3.0, token_at=3.0, new_token_ids=[7])
    t.record(out)
    t.record(SimpleNamespace(arrival_at=1.0, scheduled_at=2.0, first_token_at=3.0, token_at=4.5, new_token_ids=[8]))
    t.record(SimpleNamespace(arrival_at=None, scheduled_at=None, first_token_at=None, token_at=9.0, new_token_ids=[]))
    assert (t.arrival, t.scheduled, t.first_token, t.last_token) == (1.0, 2.0, 3.0, 4.5)
