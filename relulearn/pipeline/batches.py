"""The random streams and the Gaussian batches every source draws from, and the errors a source's labels can
raise: the bottom of the pipeline's sources (:mod:`.sources` for the planted teachers and the dispatch,
:mod:`.blackbox` for users' callables and ONNX models)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

__all__ = [
    "BATCH_ROWS",
    "BATCH_BYTES",
    "SAMPLE_STREAMS",
    "Stream",
    "batch_rows",
    "generator",
    "SourceDataError",
    "LabelShapeError",
    "at_rows",
    "gaussian_batches",
]

#: rows per generated batch at most; part of the definition of a chunk's bytes (format version).
BATCH_ROWS = 4096
#: bytes of one batch of inputs at most (format 2): glibc serves larger arrays by mmap, so every
#: batch above it is page-faulted and zeroed by the kernel afresh (measured at d = 10^4 with 4096 rows:
#: half of a worker's CPU time in the kernel); the workers' malloc keeps arrays up to this size
#: on the heap (:func:`relulearn.pipeline.worker.tune_malloc`)
BATCH_BYTES = 32 * 2**20


def batch_rows(d: int) -> int:
    """Rows per generated batch at input dimension ``d``: ``BATCH_ROWS`` up to d = 1024, then as many
    as ``BATCH_BYTES`` hold (409 at d = 10^4), at least one."""
    return max(1, min(BATCH_ROWS, BATCH_BYTES // (8 * int(d))))


class Stream:
    """Stream ids: independent random streams of one seed."""

    INPUTS = 0
    NOISE = 1
    PILOT = 2
    DIRECTIONS = 3
    TEACHER = 4
    HELD_OUT = 5  # bounded samples a learning method fits on (train / validation)
    TEST = 6  # fresh samples for evaluation, never used by estimation or learning
    SKETCH = 7  # Gaussian test matrices Ω of sketched second-moment families


#: streams of samples, the bulk of a run's random numbers: drawn with SFC64 (format 2), whose normals
#: come 1.5× faster than Philox's here (108 vs 71 M/s on one core) - at d = 10^4 generating x is most
#: of a chunk's cost
SAMPLE_STREAMS = frozenset({Stream.INPUTS, Stream.NOISE, Stream.PILOT, Stream.HELD_OUT, Stream.TEST})


def generator(seed: int, stream: int, counter: int = 0) -> np.random.Generator:
    """The generator of ``(seed, stream, counter)``: its own SeedSequence key, so every triple is an
    independent stream, drawn the same on every machine.

    Sample streams (:data:`SAMPLE_STREAMS`) use SFC64; the small draws (teachers, direction banks,
    sketch test matrices) keep Philox, so a planted teacher has the same weights as in format 1.
    """
    ss = np.random.SeedSequence(entropy=int(seed), spawn_key=(int(stream), int(counter)))
    bits = np.random.SFC64(ss) if stream in SAMPLE_STREAMS else np.random.Philox(ss)
    return np.random.Generator(bits)


class SourceDataError(ValueError):
    """A source produced values the statistics cannot use (NaN or inf)."""


class LabelShapeError(SourceDataError):
    """A black-box teacher answered a batch with labels of the wrong shape or type, or failed on it
    (the message names the batch's rows once the chunk is known: :func:`at_rows`)."""


def at_rows(err: LabelShapeError, chunk_id: int | None, row: int) -> LabelShapeError:
    """``err`` with the place of the failing batch: chunk and first row, or a sample outside the chunks."""
    where = (
        f"chunk {chunk_id}, the batch from row {row}"
        if chunk_id is not None
        else f"the batch from row {row} of a sample drawn outside the run's chunks (pilot, held-out or test samples)"
    )
    return LabelShapeError(f"{where}: {err}")


def gaussian_batches(
    source: Any, gen_x: np.random.Generator, gen_noise: np.random.Generator, n: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """``n`` samples ``x ~ N(0, I_d)``, ``y = source.labels(x) + σ ε`` in batches of :func:`batch_rows` rows:
    the inputs of every teacher, planted or black box (``source``: ``d``, ``labels``, ``noise_std``)."""
    step = batch_rows(source.d)
    for start in range(0, n, step):
        rows = min(step, n - start)
        x = gen_x.standard_normal((rows, source.d))
        y = source.labels(x)
        if source.noise_std > 0:
            y = y + source.noise_std * gen_noise.standard_normal(y.shape)
        yield x, y
