"""Streaming statistics: one family per module, each a small class with ``init / update / terms / finalize``.

A statistic accumulates *sums* over samples in an accumulator (a dict of float64 arrays).
The quantity it estimates is ``terms(sums) / N`` where ``terms`` is linear (the identity
for most statistics; the raw-to-Hermite conversion for the Hermite tensors; suffix sums
over bins for the filtered matrices). The standard error of every entry comes from the
spread of per-chunk values: the accumulation also keeps ``Σ_c terms(chunk sum_c)²`` over
the equal-size chunks c (docs/design.md §3, "Standard errors").

Modules: :mod:`.base` (the accumulation protocol), :mod:`.family` (a :class:`~.family.Family`: that protocol
plus everything else about a family, declared on its class: its cost per sample, partial size, pilot pass,
form and array descriptions), :mod:`.work` (the :class:`~.work.Work` its cost is counted in), :mod:`.build`
(what a family is built from), :mod:`.registry` (section name → family class), one module per family named
after its configuration section (:mod:`.basic`, :mod:`.contracted`, :mod:`.sketch`, ...: the registry lists
them all), the wrapper that computes a
family per output of a label vector (:mod:`.per_output`), helpers several families share (:mod:`.pilot`,
:mod:`.expansion`), and the driver-side bookkeeping (:mod:`.partial`: a :class:`Partial` per block, merged in
block order), so that the same code runs in a worker, in a single-process loop and in tests.

This package imports nothing itself: import each name from the module that defines it.
"""
