"""Sizes checked before allocation: the arrays a configuration's source and statistics need, from the
configuration alone, against this machine's memory (the statistics' block partial against
``run.worker_memory``: :func:`.projection.check_statistics_sizes`).

A configuration can ask for arrays no machine holds (``source.d: 10^9``: one row of inputs is 8 GB, a planted
teacher's weights 24 GB, the d × d sums 8 EB); numpy then fails deep inside, or the kernel's overcommit lets the
process grow until it is killed. These checks are arithmetic on the configuration and run first.
"""

from __future__ import annotations

from typing import Any

from ..npyfile import machine_memory
from .batches import batch_rows
from .plan import MemoryBudgetError

__all__ = [
    "BATCH_COPIES",
    "ANSWER_COPIES",
    "machine_memory",
    "format_bytes",
    "source_bytes",
    "answers_bytes",
    "check_source_sizes",
    "check_answer_sizes",
]

_F = 8

#: rows of an input batch in a worker's memory (a batch, its weighted copy and the product's operand)
BATCH_COPIES = 3
#: a black box's answers to one batch in a worker's memory: the array it returns and relulearn's float64 copy
ANSWER_COPIES = 2


def format_bytes(b: float) -> str:
    """``512 MB``, ``4.6 GB``: bytes in decimal units."""
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if b >= size:
            return f"{b / size:.3g} {unit}"
    return f"{b:.0f} B"


def _teacher(teacher: Any, d: int) -> tuple[int, int, str]:
    """float64 entries of a planted teacher's weights, its widest hidden layer, and the keys that size them
    (0, 0 for files and black boxes: their sizes are the files' own)."""
    kind = getattr(teacher, "kind", None)
    if kind == "one_hidden_relu":
        return int(teacher.width) * (d + 1), int(teacher.width), "source.teacher.width"
    if kind in ("deep_relu", "random_xavier"):
        widths = [int(w) for w in teacher.widths]
        layers = [d, *widths, 1]
        return sum(a * b for a, b in zip(layers, layers[1:])), max(widths), "source.teacher.widths"
    if kind == "two_layer":
        width, outputs = int(teacher.width), int(teacher.outputs)
        return width * (d + outputs), max(width, outputs), "source.teacher.width and outputs"
    return 0, 0, ""


def source_bytes(source: Any) -> dict[str, tuple[int, str]]:
    """The largest arrays of a source section (:class:`relulearn.config.SourceConfig`) before any sample, each
    with the keys that size it: one batch of inputs as a worker holds it, a planted teacher's weights and its
    hidden units' values on one batch."""
    d = int(source.d)
    rows = batch_rows(d)
    of_rows = f"{rows:,} row{'s' if rows > 1 else ''}"
    out = {
        f"one batch of inputs ({of_rows} × source.d = {d:,}, {BATCH_COPIES} copies)": (
            BATCH_COPIES * _F * rows * d,
            "source.d",
        )
    }
    if source.data is None:
        entries, widest, keys = _teacher(source.teacher, d)
        if entries:
            out[f"the planted teacher's weights ({entries:,} numbers)"] = (_F * entries, f"source.d or {keys}")
            out[f"the teacher's hidden units on one batch ({of_rows} × {widest:,} units)"] = (
                _F * rows * widest,
                keys,
            )
    return out


def check_source_sizes(source: Any) -> None:
    """Refuse a source whose arrays exceed this machine's memory, before any is allocated.

    Raises
    ------
    MemoryBudgetError
        Naming the array, its bytes, the machine's memory and the keys to lower.
    """
    memory = machine_memory()
    if memory is None:
        return
    for what, (need, keys) in source_bytes(source).items():
        if need > memory:
            raise MemoryBudgetError(
                f"{what} would take {need:,} bytes ({format_bytes(need)}), more than this machine's memory "
                f"({format_bytes(memory)}); lower {keys}. Nothing was written"
            )


def answers_bytes(d: int, outputs: int) -> int:
    """Bytes of a teacher's answers to one batch of inputs at ``source.d = d`` as a worker holds them
    (:data:`ANSWER_COPIES` of batch rows × ``outputs`` float64 numbers)."""
    return ANSWER_COPIES * _F * batch_rows(int(d)) * int(outputs)


def check_answer_sizes(label: str, d: int, outputs: int) -> None:
    """Refuse a black-box teacher whose answers to one batch would exceed this machine's memory, once its probe
    (two rows) has told its outputs per row and before any batch is asked of it.

    Raises
    ------
    MemoryBudgetError
        Naming the teacher, its outputs per row, the bytes and the fix.
    """
    memory = machine_memory()
    need = answers_bytes(d, outputs)
    if memory is not None and need > memory:
        rows = batch_rows(int(d))
        raise MemoryBudgetError(
            f"{label} returns {outputs:,} outputs per row: its answers to one batch ({rows:,} rows × "
            f"{outputs:,} outputs, {ANSWER_COPIES} copies) would take {need:,} bytes ({format_bytes(need)}), "
            f"more than this machine's memory ({format_bytes(memory)}); make the function return fewer outputs "
            "per row (a teacher answers (rows,) or (rows, m)). Nothing was written"
        )
