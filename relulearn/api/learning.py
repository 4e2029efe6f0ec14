"""Learning from a store: the method's options and setting checked before any work, the extra passes it asks
for, the model written and the learn recorded in the store (``learn``)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np

from ..aligned import one_blas_thread
from ..config import RunConfig
from ..estimators.base import PassRequest, method_entry
from ..methods import METHODS
from ..network import Network
from ..pipeline.projection import format_seconds
from ..pipeline.run import estimate as _estimate
from ..pipeline.sources import data_of
from ..storage import RunStore, StoreError, open_store, read_one_commit
from .execution import HeldOut, Where, mapper, working
from .keywords import split_keywords, takes_keywords

if TYPE_CHECKING:
    from ..pipeline.data import DataSource


def check_setting(method: str, source: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Refuse, before any work, a source outside the method's setting (vector labels for a method of one
    output; the method's own ``check_setting``); returns the options, completed from the source where the
    method needs it (``exact``'s activation, ``moments``' biases)."""
    from ..pipeline.sources import label_outputs

    outputs = label_outputs(source)
    if outputs and not METHODS[method].vector_labels:
        several = " or ".join(f"--method {m.name}" for m in METHODS.values() if m.vector_labels)
        raise ValueError(
            f"the source has {outputs} outputs (vector labels) but --method {method} learns a scalar label; "
            f"set source.output to the output to learn, or use {several} (networks with vector outputs)"
        )
    return method_entry(method).check_setting(source, dict(options), outputs)


def setting_source(cfg: RunConfig) -> Any:
    """What :func:`_check_setting` looks at, before a run: the source itself, or for data (whose scan the
    run's workers make, not the driver) its width, scalar label and whitening."""
    from types import SimpleNamespace

    from ..pipeline.sources import make_source

    if cfg.source.data is None:
        return make_source(cfg)
    return SimpleNamespace(
        d=cfg.source.d, outputs=None, network=None, whitening=True if cfg.source.data.whiten else None
    )


def _pass_url(store: str, name: str, statistics: dict) -> str:
    """Where a requested pass is stored: its name and a digest of what it computes, so that
    a different request (another sample count, width or candidate) never collides with it."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(statistics, sort_keys=True).encode()).hexdigest()[:12]
    return f"{store.rstrip('/')}/passes/{name}-{digest}"


def learn_with(
    where: Where,
    store: str,
    method: str,
    options: dict[str, Any],
    out: str | None,
    progress: TextIO | None,
    break_lock: bool = False,
    projected: dict[str, tuple[float, int]] | None = None,
) -> dict[str, Any]:
    from ..config import config_from_dict
    from ..pipeline.sources import label_outputs, make_source
    from ..progress import reporting as stage_progress

    t0 = time.perf_counter()
    mod = method_entry(method)
    # the configuration, the sample count and the statistics of one commit, checked against its manifest (a
    # damaged store is refused here; one a writer extends meanwhile is read again)
    run, stats = read_one_commit(store, lambda run: (run, run.all_arrays()))
    cfg = config_from_dict(run.meta["config"], where=f"stored in {store}")
    source = make_source(cfg)
    options = check_setting(method, source, options)
    outputs = label_outputs(source)

    samples = HeldOut(source, cfg.seed)
    passes: list[dict] = []
    pass_info: list[dict] = []
    for _ in range(mod.MAX_PASSES + 1):  # a method asks for a bounded number of passes
        # the driver's products give the same bits in any process (CLI, notebook, tests); the long stages
        # (enumeration, refinement, polish) report to the command's progress stream
        with one_blas_thread(), stage_progress(progress):
            result = mod.learn(stats, passes, samples, mapper=mapper(where.client), seed=cfg.seed, **options)
        if not isinstance(result, PassRequest):
            break
        url = _pass_url(store, result.name, result.statistics)
        pass_cfg = config_from_dict(dict(cfg.to_dict(), statistics=result.statistics), where="of a requested pass")
        alone, on = _pass_seconds(pass_cfg, run.samples, where.workers, outputs)
        if where.may_start:  # a local cluster only where this pass pays for its start
            where.for_pass(alone, on)
        # projected again at the shapes the pass really has (the plan's may be bounds: k = d without a width),
        # where it runs; whether it moved is judged on as many workers as the plan projected it
        when = alone if where.client is None else on
        if progress is not None:
            planned, planned_workers = (projected or {}).get(result.name, (None, 1))
            same = alone if planned_workers == 1 else on
            print(f"pass '{result.name}': {result.reason} ({_moved(when, same, planned)})", file=progress)
        # a pass is a store of its own, written under its own lease
        summary = _estimate(
            pass_cfg,
            url,
            samples=run.samples,
            client=where.client,
            progress=progress,
            break_lock=break_lock,
            projected=when,
        )
        pass_info.append({"name": result.name, "store": url, "reason": result.reason, "seconds": summary.seconds})
        passes.append(open_store(url).all_arrays())
    else:
        raise RuntimeError(f"method {method} kept asking for passes; this is a bug, please report it")
    net = result.network
    if data_of(source) is not None and isinstance(net, Network):  # whitened data: back to the raw inputs
        net = cast("DataSource", source).to_raw(net)
    if out is not None:
        net.save(out)
    done = {
        "method": method,
        "store": store,
        "out": out,
        **model_shape(net),
        "samples": run.samples,
        "passes": pass_info,
        "runs_in": "in process" if where.client is None else "cluster",
        "seconds": time.perf_counter() - t0,
        "report": result.report,
    }
    _record_learn(store, done, net)
    return done


#: a pass re-projected this far (as a ratio) from the plan's projection is said to have moved
MOVED = 1.3


def _moved(now: float, same: float, planned: float | None) -> str:
    """The words of a pass's projection ``now`` where it runs: and where its projection on the plan's workers,
    ``same``, moved from the plan's (past :data:`MOVED` either way), both."""
    if planned is None or planned <= 0 or 1 / MOVED <= same / planned <= MOVED:
        return f"projected {format_seconds(now)}"
    return f"projected {format_seconds(now)} at the shapes it has; the plan said {format_seconds(planned)}"


def _pass_seconds(cfg: RunConfig, samples: int, workers: int, outputs: int | None) -> tuple[float, float]:
    """A pass's projected seconds in process and on a local cluster of ``workers``."""
    from ..pipeline.calibration import calibrate, source_cost
    from ..pipeline.projection import project_pass

    rates = calibrate()
    src = source_cost(cfg, rates)
    alone, on = (
        project_pass(cfg, rates, workers=w, samples=samples, source=src, outputs=outputs).projected_seconds
        for w in (1, workers)
    )
    return alone, on


#: a learn record keeps the network learned when it has at most this many weights (the report's test error
#: against the samples evaluates every recorded network)
RECORD_WEIGHTS = 200_000


def _record_learn(store: str, done: dict[str, Any], net: Any) -> None:
    """Keep what a learn found beside the store's statistics, for ``relulearn report`` (its learning curves, and
    the held-out loss against the samples as the store is extended); a store that cannot take it loses nothing."""
    import json

    losses = done["report"].get("validation_relative_loss")
    chosen = done["report"].get("chosen")
    doc = {k: done[k] for k in ("method", "samples", "seconds", "kind")}
    if isinstance(losses, dict) and losses:
        doc["validation_relative_loss"] = losses.get(chosen, min(losses.values()))
    else:
        doc["validation_relative_loss"] = None
    doc["report"] = json.loads(json.dumps(done["report"], default=str))
    if isinstance(net, Network) and sum(w.size for w in net.weights) <= RECORD_WEIGHTS:
        doc["network"] = {k: (v.tolist() if v.dtype.kind == "f" else str(v)) for k, v in net.to_arrays().items()}
    try:
        RunStore(store).add_record("learn", doc)
    except (StoreError, OSError):
        pass


def model_shape(model: Any) -> dict[str, Any]:
    """What kind of model a method returned, and its size: width and depth of a network, degree
    (and subspace rank) of a polynomial."""
    from ..polynomial import PolynomialModel

    if isinstance(model, PolynomialModel):
        return {
            "kind": "polynomial",
            "degree": model.degree,
            "input_dim": model.input_dim,
            "subspace_rank": None if model.basis is None else model.dim,
        }
    out = {
        "kind": "network",
        "width": int(model.weights[0].shape[0]),
        "depth": int(model.depth),
        "input_dim": model.input_dim,
    }
    if model.depth == 1 and model.output_dim == 1 and out["width"] <= 64:
        # the units at a glance, in the scale-free form compare uses: λ_i ‖u_i‖ and b_i / ‖u_i‖
        norms = np.linalg.norm(model.weights[0], axis=1)
        units = {"output_weights": (model.weights[1][0] * norms).tolist()}
        if model.biases is not None:
            units["offsets"] = (model.biases[0] / np.where(norms > 0, norms, 1.0)).tolist()
            units["output_bias"] = float(model.biases[1][0])
        out["units"] = units
    return out


@takes_keywords(
    {
        "store": "str\n    The store holding the statistics (local directory or fsspec URL).",
        "method": "str\n    The learning method (``relulearn.METHODS``; default ``moments``).",
        "out": "str, optional\n    Write the learned model there (``.npz``).",
    }
)
def learn(store: str, method: str = "moments", *, out: str | None = None, **keywords: Any) -> dict[str, Any]:
    """Learn a network from the statistics in ``store`` with a learning ``method``.

    Runs the extra passes the method asks for (stored under ``STORE/passes/``), evaluates
    candidate batches on the cluster, and writes the network to ``out`` (``.npz``). Each method takes the
    options its declaration names (:data:`relulearn.methods.METHODS`, listed below with what each does for
    each method); an option of another method is refused. ``polynomial``'s model is a
    :class:`~relulearn.polynomial.PolynomialModel`.

    The store is only read (learn takes no lease on it): every statistic and the ledger from one commit,
    checked against its manifest (a damaged store is refused with
    :class:`~relulearn.storage.errors.StoreDamagedError`, naming the array and chunk, before any method runs);
    each extra pass is a store of its own, written under its own lease (``break_lock``: break a stale one, left
    by a learn that died).

    Where it runs: in this process, unless ``client``, ``workers``, ``scheduler`` or ``DASK_SCHEDULER_ADDRESS`` name
    a cluster; a local cluster is then started only for a pass the method asks for that is projected to gain
    more than the cluster's start costs (:func:`relulearn.runplan.where_to_run`). The network is the same bits
    wherever it is learned.

    Returns
    -------
    dict
        ``method``, ``width``, ``passes`` run, ``runs_in`` (``"in process"``, or ``"cluster"`` when the last of
        its work ran on one), ``seconds`` and the method's ``report``.
    """
    options, ex = split_keywords("learn", method, keywords)
    open_store(store)  # no store, or a damaged root, is refused before a cluster starts
    # in this process unless told otherwise: a local cluster starts only for a pass that pays for its start
    with working(ex, in_process=True) as (where, _):
        return learn_with(where, store, method, options, out, ex.progress, ex.break_lock)
