"""SIGTERM and SIGINT during an accumulation run: raised as ``KeyboardInterrupt`` (so the run commits what is
merged, then stops), but never in the middle of a block's merge or of a commit.
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

__all__ = ["Interrupts", "signals_as_interrupts"]


class Interrupts:
    """SIGTERM and SIGINT as ``KeyboardInterrupt``, held while a block is merged or a commit runs.

    A signal raised between two of a block's arrays would leave the block merged into some arrays only, and the
    commit on the interrupt would store those sums under the sample count of the blocks before it.

    A commit waits on zarr's writer thread; an exception raised in the waiting thread does not stop
    the writes, and the commit that follows the interrupt (same generation number) would delete a
    directory the writer is still filling (``Directory not empty``). So a signal that arrives inside
    :meth:`held` is raised when the commit has ended.
    """

    def __init__(self) -> None:
        self.holding = False
        self.pending: int | None = None

    def handler(self, signum: int, frame: Any) -> None:  # noqa: ARG002 - signal handler signature
        if self.holding:
            self.pending = signum
            return
        raise KeyboardInterrupt(f"received signal {signum}")

    @contextlib.contextmanager
    def held(self):
        outer, self.holding = self.holding, True
        try:
            yield
        finally:  # an error of the commit itself propagates as it is; a held signal is raised after a commit
            self.holding = outer
        if not outer and self.pending is not None:
            signum, self.pending = self.pending, None
            raise KeyboardInterrupt(f"received signal {signum}")


@contextlib.contextmanager
def signals_as_interrupts(interrupts: Interrupts) -> Iterator[None]:
    """SIGTERM behaves like Ctrl-C inside the block: ``interrupts`` handles both (in the main thread only, the
    one where Python delivers signals); the previous handlers are restored at its end."""
    old_handlers = {}
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            old_handlers[sig] = signal.getsignal(sig)
            signal.signal(sig, interrupts.handler)
    try:
        yield
    finally:
        for sig, handler in old_handlers.items():
            signal.signal(sig, handler)
