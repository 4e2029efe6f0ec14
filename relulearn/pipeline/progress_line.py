"""The progress line of an accumulation run: samples done, samples/s and the ETA over completed blocks."""

from __future__ import annotations

import math
import time
from typing import TextIO

from ..progress import clock

__all__ = ["ProgressLine"]


class ProgressLine:
    """One line over completed blocks: samples done, samples/s, ETA (the plan's projection, marked ``~``, until
    a block is merged; then from the measured rate)."""

    def __init__(self, total: int, done: int, stream: TextIO | None, projected: float | None = None):
        self.total, self.start_done, self.stream = total, done, stream
        self.t0 = time.perf_counter()
        self.last = 0.0
        self.tty = bool(stream is not None and getattr(stream, "isatty", lambda: False)())
        self.projected = projected

    def update(self, done: int, force: bool = False) -> None:
        """Show ``done`` samples (at most every 0.2 s on a terminal, 5 s elsewhere, unless ``force``)."""
        if self.stream is None:
            return
        now = time.perf_counter()
        if not force and now - self.last < (0.2 if self.tty else 5.0):
            return
        self.last = now
        rate = (done - self.start_done) / max(now - self.t0, 1e-9)
        eta = (self.total - done) / rate if rate > 0 else math.inf
        mark = ""
        if rate <= 0 and self.projected is not None:  # nothing measured yet: the plan's projection
            eta, mark = max(self.projected - (now - self.t0), 0.0), "~"
        frac = done / self.total if self.total else 1.0
        bar = "#" * int(30 * frac)
        eta_s = "--" if not math.isfinite(eta) else mark + clock(eta)
        line = f"[{bar:<30}] {done:,}/{self.total:,} samples  {rate:,.0f} samples/s  ETA {eta_s}"
        self.stream.write(("\r" + line) if self.tty else (line + "\n"))
        self.stream.flush()

    def close(self) -> None:
        """End a terminal's line."""
        if self.stream is not None and self.tty:
            self.stream.write("\n")
            self.stream.flush()
