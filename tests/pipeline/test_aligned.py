"""Fresh aligned copies (relulearn.aligned): what every task computes with, whatever the transport."""

from __future__ import annotations

import dataclasses

import numpy as np
from transport import unaligned

from relulearn.aligned import ALIGNMENT, fresh, fresh_map, is_aligned
from relulearn.pipeline.families import build_statistics
from relulearn.pipeline.sources import make_source

from conftest import make_config


def test_unaligned_arrays_come_back_aligned_and_equal():
    a = np.random.default_rng(0).standard_normal((20, 20))
    u = unaligned(a)
    assert not u.flags.aligned and u.ctypes.data % 64 == 11
    c = fresh(u)
    assert is_aligned(c) and c.flags.aligned and c.flags.writeable and np.array_equal(c, a)
    # numpy uses BLAS for the copy again: its product is the aligned array's, bit for bit
    x = np.random.default_rng(1).standard_normal((4096, 20))
    assert np.array_equal(x @ c.T, x @ a.T)


def test_fresh_walks_sources_and_statistics_without_touching_them():
    cfg = make_config(source={"d": 20, "teacher": {"kind": "one_hidden_relu", "width": 3}})
    source = make_source(cfg)
    stats = build_statistics(cfg, source)
    # as a worker may receive them
    object.__setattr__(source.network, "weights", tuple(unaligned(w) for w in source.network.weights))
    contracted = next(s for s in stats if s.name == "contracted")
    contracted.directions = unaligned(contracted.directions)
    new_stats, new_source = fresh((stats, source))
    for w_new, w_old in zip(new_source.network.weights, source.network.weights):
        assert is_aligned(w_new) and np.array_equal(w_new, w_old) and w_new is not w_old
    new_contracted = next(s for s in new_stats if s.name == "contracted")
    assert is_aligned(new_contracted.directions) and not contracted.directions.flags.aligned
    assert new_contracted is not contracted and type(new_contracted) is type(contracted)
    arrays = [v for s in new_stats for v in vars(s).values() if isinstance(v, np.ndarray)]
    assert arrays and all(is_aligned(v) for v in arrays)


def test_fresh_map_hands_the_function_aligned_items():
    items = [(unaligned(np.arange(40.0).reshape(8, 5)), 2.0)]
    seen = list(map(fresh_map(lambda args: (args[0].ctypes.data % ALIGNMENT, float(args[0].sum() * args[1]))), items))
    assert seen == [(0, 2.0 * np.arange(40.0).sum())]


@dataclasses.dataclass(frozen=True)
class _Weighted:
    """A mapped function that carries arrays (as a method's streamed refinement does)."""

    w: np.ndarray

    def __call__(self, x: np.ndarray) -> tuple[int, int, float]:
        return self.w.ctypes.data % ALIGNMENT, x.ctypes.data % ALIGNMENT, float((x @ self.w).sum())


def test_fresh_map_copies_the_arrays_a_callable_dataclass_carries():
    """Found by the exact method's refinement: its parameters travel inside the mapped function,
    and an unaligned copy on a worker summed in another order than in process."""
    fn = _Weighted(unaligned(np.arange(5.0)))
    seen = list(map(fresh_map(fn), [unaligned(np.ones((3, 5)))]))
    assert seen == [(0, 0, 30.0)]
    assert fn.w.ctypes.data % ALIGNMENT != 0  # the original is not touched
