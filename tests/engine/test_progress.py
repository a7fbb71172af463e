"""Progress of long steps (g906/engine/progress.py): a rich bar on a terminal once a step has run
past its threshold, nothing drawn elsewhere, and a one-line summary in the log either way."""

from __future__ import annotations

import logging
import time

import pytest

from g906.engine import progress
from g906.engine.progress import Step


def test_summary_without_a_terminal(caplog, monkeypatch):
    monkeypatch.setattr(progress, "_terminal", lambda: False)
    with caplog.at_level(logging.INFO, logger="g906.progress"):
        with Step("Loading m.gguf", total=3 * 2**20, unit="bytes", count_noun="tensors") as step:
            for _ in range(3):
                step.advance(2**20, count=1)
        assert step._bar is None and step._timer is None          # nothing drawn
    assert [r.getMessage() for r in caplog.records] == [f"Loading m.gguf: 3 tensors, 3.0 MiB in {step.seconds:.1f}s"]


def test_a_bar_appears_on_a_terminal_after_the_threshold(caplog, monkeypatch):
    monkeypatch.setattr(progress, "_terminal", lambda: True)
    shown = []
    real_show = Step._show

    def spy(self):
        real_show(self)
        shown.append(self._bar is not None)

    monkeypatch.setattr(Step, "_show", spy)
    with caplog.at_level(logging.INFO, logger="g906.progress"):
        with Step("Warming up", count_noun="engine steps", show_after=0.05) as step:
            deadline = time.monotonic() + 5
            while not shown and time.monotonic() < deadline:
                time.sleep(0.01)
            step.advance(count=2)
        assert shown == [True] and step._bar is None              # drawn, then removed at the end
    assert caplog.records[-1].getMessage().startswith("Warming up: 2 engine steps in ")
    with Step("Quick", show_after=10) as quick:                   # ends before the threshold: no bar
        pass
    assert quick._bar is None and quick._timer is None


def test_a_failed_step_logs_no_summary(caplog, monkeypatch):
    monkeypatch.setattr(progress, "_terminal", lambda: False)
    with caplog.at_level(logging.INFO, logger="g906.progress"):
        with pytest.raises(ValueError):
            with Step("Loading bad.gguf", total=10, unit="bytes"):
                raise ValueError("broken")
    assert not caplog.records
