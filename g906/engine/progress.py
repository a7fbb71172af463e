"""Progress of the engine's long steps (loading a GGUF or safetensors model, dequantizing for the
CPU, repacking, graph capture, warm-up): a rich bar on a terminal for a step that runs longer
than a second, and a one-line summary in the log ("g906.progress", INFO) when it ends.

    with Step("Loading model.gguf", total=nbytes, unit="bytes", enabled=progress) as step:
        for name, t in tensors:
            ...
            step.advance(t.nbytes, count=1)
    # log: "Loading model.gguf: 291 tensors, 187.3 MiB in 3.2s"

Nothing is drawn when stderr is not a terminal (servers under systemd, tests): the summary line
says what happened there. A step that fails draws nothing more and logs no summary."""

from __future__ import annotations

import logging
import sys
import threading
import time

log = logging.getLogger("g906.progress")

SHOW_AFTER_S = 1.0      # a step shorter than this never draws a bar


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.1f} {unit}" if unit != "B" else f"{int(n)} B"
        n /= 1024
    return f"{n:.1f} GiB"


class Step:
    """One long step. total: its size in `unit` ("bytes" or a noun such as "graphs"; None: a
    spinner); `count_noun` names what advance(count=) counts in the summary (e.g. "tensors")."""

    def __init__(self, label: str, *, total: float | None = None, unit: str = "items", count_noun: str | None = None,
                 enabled: bool = True, show_after: float = SHOW_AFTER_S):
        self.label = label
        self.total = total
        self.unit = unit
        self.count_noun = count_noun
        self.enabled = enabled
        self.done = 0.0
        self.count = 0
        self.t0 = time.perf_counter()
        self.seconds = 0.0
        self._bar = None
        self._task = None
        self._lock = threading.Lock()
        self._timer = None
        if enabled and _terminal():
            self._timer = threading.Timer(show_after, self._show)
            self._timer.daemon = True
            self._timer.start()

    def _show(self) -> None:
        with self._lock:
            if self._bar is not None or self._timer is None:
                return
            try:
                from rich.console import Console
                from rich.progress import (BarColumn, DownloadColumn, MofNCompleteColumn, Progress, SpinnerColumn,
                                           TextColumn, TimeElapsedColumn, TimeRemainingColumn)

                cols = [SpinnerColumn(), TextColumn("{task.description}"), BarColumn()]
                if self.total is not None:
                    cols += [DownloadColumn() if self.unit == "bytes" else MofNCompleteColumn(), TimeRemainingColumn()]
                cols.append(TimeElapsedColumn())
                bar = Progress(*cols, console=Console(stderr=True), transient=True)
                bar.start()
                self._task = bar.add_task(self.label, total=self.total, completed=self.done)
                self._bar = bar
            except Exception:  # noqa: BLE001 - a progress bar must never break a load
                self._bar = None

    def advance(self, amount: float = 1, *, count: int = 0) -> None:
        self.done += amount
        self.count += count
        bar = self._bar
        if bar is not None:
            bar.update(self._task, completed=self.done)

    def _stop(self) -> None:
        with self._lock:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None
            if self._bar is not None:
                try:
                    self._bar.stop()
                except Exception:  # noqa: BLE001
                    pass
                self._bar = None

    def summary(self) -> str:
        parts = []
        if self.count_noun:
            parts.append(f"{self.count} {self.count_noun}")
        if self.unit == "bytes" and self.done:
            parts.append(_size(self.done))
        elif not self.count_noun and self.total is not None:
            parts.append(f"{int(self.done)} {self.unit}")
        what = ", ".join(parts)
        return f"{self.label}: {what + ' ' if what else ''}in {self.seconds:.1f}s"

    def close(self, *, ok: bool = True) -> None:
        self.seconds = time.perf_counter() - self.t0
        self._stop()
        if ok and self.enabled:
            log.info("%s", self.summary())

    def __enter__(self) -> "Step":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.close(ok=exc_type is None)


def _terminal() -> bool:
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False
