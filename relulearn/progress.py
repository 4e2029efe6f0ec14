"""Progress of the long stages of a learn (enumeration, refinement passes, polish): one line per step, on the
stream the command reports to (a terminal's line is rewritten in place).

The estimators call :func:`step` wherever a stage advances; it prints only inside :func:`reporting` (which
``relulearn learn`` and ``fit`` open around a learn) and at most every :data:`INTERVAL` seconds (or
:data:`TTY_INTERVAL` on a terminal), so a library caller and the tests see nothing. The reporter lives in a
context variable of the driver's thread: workers never print.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import TextIO

__all__ = ["clock", "reporting", "step"]

#: seconds between two lines on a stream that is not a terminal (a log file, a CI log)
INTERVAL = 10.0

#: seconds between two rewrites of a terminal's line
TTY_INTERVAL = 0.5


@dataclass
class _Reporter:
    stream: TextIO
    tty: bool
    stage: str = ""
    started: float = 0.0
    last: float = -1e9
    shown: set = field(default_factory=set)

    #: the stage's latest line when it was not written (too soon after the last): written when the stage ends,
    #: so that a log shows where each stage stopped (a polish converged in 3 of 30 steps), not only its start
    pending: str | None = None

    def step(self, stage: str, done: int, total: int | None, detail: str) -> None:
        now = time.perf_counter()
        if stage != self.stage:
            self._flush()
            self.stage, self.started = stage, now
            if self.tty and self.shown:
                self.stream.write("\n")
        line = f"{stage}: {done:,}" + (f"/{total:,}" if total else "")
        if total and done:
            line += f"  ETA at most {clock((now - self.started) / done * (total - done))}"
        if detail:
            line += f"  ({detail})"
        first = stage not in self.shown
        if not first and now - self.last < (TTY_INTERVAL if self.tty else INTERVAL) and done != total:
            self.pending = line
            return
        self.last = now
        self.shown.add(stage)
        self._write(line)

    def _write(self, line: str) -> None:
        self.pending = None
        self.stream.write(("\r" + line.ljust(100)) if self.tty else line + "\n")
        self.stream.flush()

    def _flush(self) -> None:
        if self.pending is not None:
            self._write(self.pending)

    def close(self) -> None:
        self._flush()
        if self.tty and self.shown:
            self.stream.write("\n")
            self.stream.flush()


def clock(seconds: float) -> str:
    """``HH:MM:SS`` with as many hours as it takes (``663:09:59``; a clock of the day wrapped at 24 h)."""
    whole = int(max(seconds, 0.0))
    return f"{whole // 3600:02d}:{whole // 60 % 60:02d}:{whole % 60:02d}"


_CURRENT: ContextVar[_Reporter | None] = ContextVar("relulearn_progress", default=None)


@contextmanager
def reporting(stream: TextIO | None) -> Iterator[None]:
    """Report the stages run inside the block to ``stream`` (None: report nothing)."""
    if stream is None:
        yield
        return
    rep = _Reporter(stream, bool(getattr(stream, "isatty", lambda: False)()))
    token = _CURRENT.set(rep)
    try:
        yield
    finally:
        _CURRENT.reset(token)
        rep.close()


def step(stage: str, done: int, total: int | None = None, detail: str = "") -> None:
    """``stage`` has done ``done`` of at most ``total`` steps (``detail``: e.g. the loss so far). The ETA is an
    upper bound: a stage may stop early (converged, exact)."""
    rep = _CURRENT.get()
    if rep is not None:
        rep.step(stage, done, total, detail)
