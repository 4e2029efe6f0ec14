"""Orchestration: the one place that runs passes on a cluster (docs/design.md §1).

Functions here take plain arguments (paths, counts) and return plain data; the CLI
only parses arguments and prints what these return.
"""

from __future__ import annotations

import pickle
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TextIO, cast

import numpy as np

from .aligned import fresh, fresh_map, one_blas_thread
from .config import ConfigError, RunConfig, load_config
from .estimators.base import PassRequest, Samples
from .network import Network
from .pipeline.cluster import ClusterLostError, connect, connection_lost, prepare
from .pipeline.merge import merge_stores
from .pipeline.projection import format_seconds
from .pipeline.run import RunSummary
from .pipeline.run import estimate as _estimate
from .pipeline.sources import data_of
from .storage import LeaseInfo, RunStore, StoreError, open_store, read_lease, writing

if TYPE_CHECKING:
    from .pipeline.data import DataSource
    from .pipeline.sources import RunSource, TeacherSource

__all__ = [
    "estimate",
    "plan",
    "status",
    "verify",
    "merge",
    "open_store",
    "learn",
    "fit",
    "evaluate",
    "predict",
    "exact_arbitrary",
]


def estimate(
    config: str | Path | RunConfig,
    store: str,
    *,
    samples: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    commit_interval: float | None = None,
    on_start: Callable[[dict], None] | None = None,
    break_lock: bool = False,
    dashboard: str | None = None,
    new_store_here: bool = False,
) -> RunSummary:
    """Start, resume or extend the run described by ``config`` in ``store``.

    Parameters
    ----------
    config
        A YAML path or a :class:`~relulearn.config.RunConfig`.
    store
        The store location (local directory or fsspec URL).
    samples
        Total samples wanted (default: the config's ``samples``); more than the store
        holds extends the run.
    workers, scheduler
        Start a ``LocalCluster`` with ``workers`` processes (default: one per core), or
        connect to a running scheduler. Ignored when ``client`` is given.
    client
        An existing ``distributed.Client``, or the string ``"local"`` to run in this
        process without Dask.
    break_lock
        Break a stale lease on the store (left by a writer that died) before taking it.
    dashboard
        ``HOST:PORT`` of a local cluster's dashboard (default: the config's ``run.dashboard``,
        else 127.0.0.1 on a free port).
    new_store_here
        Start a new store in a folder that is not a readable store (other files stay as they are; the
        relulearn data of a store whose root metadata is missing or damaged is moved into
        ``STORE/set-aside-<time>/``, never deleted). Without it such a folder is refused.

    Raises
    ------
    StoreLockedError
        Before any cluster starts, when another writer holds the store's lease, or a
        stale lease is left and ``break_lock`` is not given.
    StoreDamagedError
        When the store is damaged (its root metadata before any cluster starts; a chunk or metadata
        document of the committed generation when the run opens it), naming what; nothing is modified.
    TooLongError
        When ``run.max_hours`` is set and the run is projected to take longer (:mod:`relulearn.runplan`).
    """
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    if cfg.run.max_hours is not None:  # projected before any work (the projection is skipped without a limit)
        from .runplan import plan_run

        plan_run(cfg, None, samples=samples, workers=_planned_workers(client, workers))
    # before a cluster starts: a refusal is immediate
    with writing(store, break_lock=break_lock, new_store_here=new_store_here) as lease:
        kw: dict[str, Any] = dict(
            samples=samples,
            progress=progress,
            commit_interval=commit_interval,
            on_start=on_start,
            lease=lease,
            new_store_here=new_store_here,
        )
        if client == "local":
            return _estimate(cfg, store, client=None, **kw)
        if client is not None:
            prepare(client)  # a client the caller made: same checks and worker setup as connect()
            return _estimate(cfg, store, client=client, **kw)
        with connect(workers=workers, scheduler=scheduler, dashboard_address=dashboard or cfg.run.dashboard) as c:
            return _estimate(cfg, store, client=c, **kw)


def status(store: str) -> dict[str, Any]:
    """What a store holds: samples, statistics, fingerprint, last commit, and ``lease``: the writer
    holding the store (host, pid, start, last heartbeat, and ``stale``: why it is stale, or None),
    or None when no writer holds it; ``damaged``: the objects of the committed generation that one
    listing shows missing or truncated (no byte is read: :func:`verify` finds altered bytes too; None
    for a store written before checksums).

    Raises
    ------
    StoreDamagedError
        When the root metadata is missing, unreadable or differs from its digest (a damaged store, not
        "no store").
    """
    try:
        out = open_store(store).summary()
    except StoreError as err:
        found = read_lease(store) if "no relulearn store" in str(err) else None
        if not isinstance(found, LeaseInfo):
            raise
        raise StoreError(f"{err}; its first run is being written by {found.describe()}") from None
    sizes = RunStore(store).check_sizes()
    out["damaged"] = None if sizes is None else [d.to_dict() for d in sizes]
    found = read_lease(store)
    out["lease"] = (
        found.to_dict()
        if isinstance(found, LeaseInfo)
        else None
        if found is None
        else {"holder": None, "stale": "its lease document cannot be read"}
    )
    return out


def verify(store: str) -> dict[str, Any]:
    """Check every chunk and metadata document of the store's committed generation (statistics and ledger,
    then each extra pass under ``passes/``) against the commit's manifest, and the root metadata against its
    digest; nothing is written.

    Returns
    -------
    dict
        ``intact`` (bool), ``arrays`` (per array: ``array``, ``chunks`` checked, ``status``), ``damaged``
        (every damaged object: ``array``, ``chunk``, ``key`` — its file — and ``problem``), ``checksums``
        (False for a store written before checksums: missing and truncated chunks are found, flipped bytes
        are not), ``root``, ``documents``, ``passes``, ``seconds``
        (:func:`relulearn.storage.verify.verify_store`).

    Raises
    ------
    StoreError
        When ``store`` holds no relulearn store or no committed run, or cannot be reached.
    """
    from .storage.verify import verify_store

    return verify_store(store)


def merge(a: str, b: str, out: str, *, break_lock: bool = False) -> dict[str, Any]:
    """Merge two stores of the same source with different seeds into a new store ``out``
    (``break_lock``: break a stale lease on ``out`` first)."""
    return merge_stores(a, b, out, break_lock=break_lock)


# ------------------------------------------------------------------ learning

from .methods import METHODS, OPTIONS, method_module  # noqa: E402 - METHODS re-exported: relulearn.api.METHODS


def _check_setting(method: str, source: Any, options: dict[str, Any]) -> dict[str, Any]:
    """Refuse, before any work, a source outside the method's setting (vector labels for a method of one
    output; the method's own ``check_setting``); returns the options, completed from the source where the
    method needs it (``exact``'s activation, ``moments``' biases)."""
    from .pipeline.sources import label_outputs

    outputs = label_outputs(source)
    if outputs and not METHODS[method].vector_labels:
        several = " or ".join(f"--method {m.name}" for m in METHODS.values() if m.vector_labels)
        raise ValueError(
            f"the source has {outputs} outputs (vector labels) but --method {method} learns a scalar label; "
            f"set source.output to the output to learn, or use {several} (networks with vector outputs)"
        )
    check = getattr(method_module(method), "check_setting", None)
    return dict(options) if check is None else check(source, dict(options), outputs)


def _setting_source(cfg: RunConfig) -> Any:
    """What :func:`_check_setting` looks at, before a run: the source itself, or for data (whose scan the
    run's workers make, not the driver) its width, scalar label and whitening."""
    from types import SimpleNamespace

    from .pipeline.sources import make_source

    if cfg.source.data is None:
        return make_source(cfg)
    return SimpleNamespace(
        d=cfg.source.d, outputs=None, network=None, whitening=True if cfg.source.data.whiten else None
    )


def _options(method: str, **given: Any) -> dict[str, Any]:
    """The method's keyword options (``width`` always); options a method does not declare
    (:attr:`relulearn.methods.Method.options`) are refused by name."""
    allowed = {"width", *METHODS[method].options}
    extra = [k for k, v in given.items() if v is not None and k not in allowed]
    if extra:
        verb = "applies" if len(extra) == 1 else "apply"
        users = [m.name for m in METHODS.values() if all(k in m.options for k in extra)]
        extra = [OPTIONS[k].flag if k in OPTIONS else f"--{k}" for k in extra]
        raise ValueError(f"{' and '.join(extra)} {verb} to --method {' or '.join(users)} only, not to {method}")
    return {k: v for k, v in given.items() if k == "width" or v is not None}


def _mapper(client: Any) -> Callable:
    """The cluster's map for candidate batches (results in input order), or the builtin map.

    Either way each item is computed on fresh aligned copies with one BLAS thread, and each
    result is copied again where it arrives (:mod:`relulearn.aligned`), so that the learned
    network does not depend on where a batch ran or how its bytes travelled.
    """
    if client is None:

        def local_map(fn: Callable, items: Any) -> list:
            # one BLAS thread, as on a worker (pipeline.worker): multi-threaded BLAS sums in another order
            with one_blas_thread():
                return [fresh(r) for r in map(fresh_map(fn), items)]

        return local_map

    def cluster_map(fn: Callable, items: Any) -> list:
        items = list(items)
        try:
            task: Any = fresh_map(fn)
            if len(items) > 1 and len(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL)) > SCATTER_BYTES:
                # a large function (a model of megabytes) goes to each worker once, not inside the task graph
                task = client.scatter(task, broadcast=True, hash=False)
                return [fresh(r) for r in client.gather(client.map(_apply, [task] * len(items), items, pure=False))]
            return [fresh(r) for r in client.gather(client.map(task, items, pure=False))]
        except Exception as err:  # noqa: BLE001 - only a lost scheduler is translated
            if connection_lost(client, err):
                raise ClusterLostError(
                    "lost the connection to the Dask scheduler while learning; the "
                    "statistics and the passes already stored are kept"
                ) from None
            raise

    return cluster_map


#: a mapped function whose pickle is larger than this is scattered to the workers once per map
SCATTER_BYTES = 1_000_000


def _apply(fn: Callable, item: Any) -> Any:
    return fn(item)


@dataclass(frozen=True)
class HeldOut:
    """Samples a method draws from the run's source (:class:`~.estimators.base.SampleDraw`):
    the held-out stream, independent of every chunk of the run; picklable, so that a method's
    mapped functions can draw their own part on a worker."""

    source: Any
    seed: int

    def __call__(self, n_train: int, n_val: int) -> Samples:
        x, y = self.part(0, n_train)
        xv, yv = self.part(1, n_val)
        return Samples(x, y, xv, yv)

    def part(self, p: int, n: int) -> tuple[np.ndarray, np.ndarray]:
        from .pipeline.sources import Stream, draw

        return draw(self.source, self.seed, Stream.HELD_OUT, n, part=p)

    def part_batches(self, p: int, n: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
        """The samples of :meth:`part` batch by batch (a mapped sum holds one batch, not the part)."""
        from .pipeline.sources import Stream, draw_batches

        return draw_batches(self.source, self.seed, Stream.HELD_OUT, n, part=p)


def _pass_url(store: str, name: str, statistics: dict) -> str:
    """Where a requested pass is stored: its name and a digest of what it computes, so that
    a different request (another sample count, width or candidate) never collides with it."""
    import hashlib
    import json

    digest = hashlib.sha256(json.dumps(statistics, sort_keys=True).encode()).hexdigest()[:12]
    return f"{store.rstrip('/')}/passes/{name}-{digest}"


def _learn_with(
    client: Any,
    store: str,
    method: str,
    options: dict[str, Any],
    out: str | None,
    progress: TextIO | None,
    break_lock: bool = False,
    projected: dict[str, float] | None = None,
) -> dict[str, Any]:
    from .config import config_from_dict
    from .pipeline.sources import make_source
    from .progress import reporting as stage_progress

    t0 = time.perf_counter()
    mod = method_module(method)
    run = open_store(store)
    cfg = config_from_dict(run.meta["config"], where=f"stored in {store}")
    source = make_source(cfg)
    options = _check_setting(method, source, options)
    stats = run.all_arrays()  # one commit, checked against its manifest (a damaged store is refused here)

    samples = HeldOut(source, cfg.seed)
    passes: list[dict] = []
    pass_info: list[dict] = []
    for _ in range(getattr(mod, "MAX_PASSES", 3) + 1):  # a method asks for a bounded number of passes
        # the driver's products give the same bits in any process (CLI, notebook, tests); the long stages
        # (enumeration, refinement, polish) report to the command's progress stream
        with one_blas_thread(), stage_progress(progress):
            result = mod.learn(stats, passes, samples, mapper=_mapper(client), seed=cfg.seed, **options)
        if not isinstance(result, PassRequest):
            break
        url = _pass_url(store, result.name, result.statistics)
        pass_cfg = config_from_dict(dict(cfg.to_dict(), statistics=result.statistics), where="of a requested pass")
        when = (projected or {}).get(result.name)
        if progress is not None:
            print(
                f"pass '{result.name}': {result.reason}"
                + (f" (projected {format_seconds(when)})" if when is not None else ""),
                file=progress,
            )
        # a pass is a store of its own, written under its own lease
        summary = _estimate(
            pass_cfg, url, samples=run.samples, client=client, progress=progress, break_lock=break_lock, projected=when
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
        **_model_shape(net),
        "samples": run.samples,
        "passes": pass_info,
        "seconds": time.perf_counter() - t0,
        "report": result.report,
    }
    _record_learn(store, done, net)
    return done


#: a learn record keeps the network learned when it has at most this many weights (the report's test error
#: against the samples evaluates every recorded network)
RECORD_WEIGHTS = 200_000


def _record_learn(store: str, done: dict[str, Any], net: Any) -> None:
    """Keep what a learn found beside the store's statistics, for ``relulearn report`` (its learning curves, and
    the held-out loss against the samples as the store is extended); a store that cannot take it loses nothing."""
    import json

    from .storage import RunStore, StoreError

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


def _model_shape(model: Any) -> dict[str, Any]:
    """What kind of model a method returned, and its size: width and depth of a network, degree
    (and subspace rank) of a polynomial."""
    from .polynomial import PolynomialModel

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


def learn(
    store: str,
    method: str = "moments",
    *,
    width: int | None = None,
    depth: int | None = None,
    budget: int | None = None,
    activation: str | None = None,
    exact_samples: int | None = None,
    refine_samples: int | None = None,
    starts: int | None = None,
    route: str | None = None,
    degree: int | None = None,
    shrink: str | None = None,
    subspace: bool | None = None,
    residual: bool | None = None,
    biases: bool | None = None,
    out: str | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    break_lock: bool = False,
    dashboard: str | None = None,
) -> dict[str, Any]:
    """Learn a network from the statistics in ``store`` with a learning ``method``.

    Runs the extra passes the method asks for (stored under ``STORE/passes/``), evaluates
    candidate batches on the cluster, and writes the network to ``out`` (``.npz``).
    ``width`` is the number of hidden units (``moments``) or the largest hidden width
    (``filtered-pca``); ``depth`` (hidden layers) and ``budget`` (candidate networks) are
    options of ``filtered-pca``; ``activation`` (``relu``, ``relu2``, ``relu3``; default: the
    teacher's), ``exact_samples`` (bounded sample of the exact step) and ``refine_samples``
    (samples streamed through the refinement; default all the store holds; 0: none) of ``exact``,
    ``moments`` and ``filtered-pca`` (its deep answers: at most 10⁷);
    ``starts`` (random starts of G, default 8) and ``route`` (``moments`` or ``stream``; default by
    width) of ``landscape``; ``degree`` (default: chosen on held-out samples), ``shrink`` (``order``, the
    default, ``none``, ``entry``), ``subspace`` (expand the inputs projected on the relevant subspace) and
    ``residual`` (re-estimate orders ≥ 3 on residual labels, default True) of ``polynomial``, whose
    model is a :class:`~relulearn.polynomial.PolynomialModel`; ``biases`` of ``moments`` (learn hidden and
    output biases; default: unless the source is a planted or file network without biases).

    The store is only read (learn takes no lease on it): every statistic and the ledger from one commit,
    checked against its manifest (a damaged store is refused with
    :class:`~relulearn.storage.errors.StoreDamagedError`, naming the array and chunk, before any method runs);
    each extra pass is a store of its own, written under its own lease (``break_lock``: break a stale one, left
    by a learn that died).
    ``dashboard``: ``HOST:PORT`` of a local cluster's dashboard (default 127.0.0.1, a free port).

    Returns
    -------
    dict
        ``method``, ``width``, ``passes`` run, ``seconds`` and the method's ``report``.
    """
    options = _options(
        method,
        width=width,
        depth=depth,
        budget=budget,
        activation=activation,
        exact_samples=exact_samples,
        refine_samples=refine_samples,
        starts=starts,
        route=route,
        degree=degree,
        shrink=shrink,
        subspace=subspace,
        residual=residual,
        biases=biases,
    )
    open_store(store)  # no store, or a damaged root, is refused before a cluster starts
    if client == "local":
        return _learn_with(None, store, method, options, out, progress, break_lock)
    if client is not None:
        prepare(client)
        return _learn_with(client, store, method, options, out, progress, break_lock)
    with connect(workers=workers, scheduler=scheduler, dashboard_address=dashboard) as c:
        return _learn_with(c, store, method, options, out, progress, break_lock)


def fit(
    config: str | Path | RunConfig,
    store: str,
    method: str = "moments",
    *,
    width: int | None = None,
    depth: int | None = None,
    budget: int | None = None,
    activation: str | None = None,
    exact_samples: int | None = None,
    refine_samples: int | None = None,
    starts: int | None = None,
    route: str | None = None,
    degree: int | None = None,
    shrink: str | None = None,
    subspace: bool | None = None,
    residual: bool | None = None,
    biases: bool | None = None,
    out: str | None = None,
    samples: int | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    break_lock: bool = False,
    dashboard: str | None = None,
    dry_run: bool = False,
) -> dict[str, Any]:
    """Estimate the statistics ``method`` needs, then learn: the one call that returns a network.

    A configuration without a ``statistics`` section gets the method's own statistics, in the form
    projected fastest under ``run.worker_memory`` (:func:`relulearn.runplan.plan_run`); the plan's
    one-line summary is printed to ``progress`` before the work, and a run projected past
    ``run.max_hours`` is refused. ``dry_run`` returns the plan (``plan``, and ``plan_lines`` to print)
    without any work. The other options are those of :func:`learn` and :func:`estimate`; the store's
    lease is taken before a cluster starts and held until the learn ends.
    """
    options = _options(
        method,
        width=width,
        depth=depth,
        budget=budget,
        activation=activation,
        exact_samples=exact_samples,
        refine_samples=refine_samples,
        starts=starts,
        route=route,
        degree=degree,
        shrink=shrink,
        subspace=subspace,
        residual=residual,
        biases=biases,
    )
    cfg = config if isinstance(config, RunConfig) else load_config(config)
    setting = _setting_source(cfg)
    _check_setting(method, setting, options)  # before anything is written
    kept = _stored_statistics(store) if "statistics" not in cfg.model_fields_set else None
    if kept is not None:
        # a run to resume or extend keeps the statistics it was started with: the form chosen by projected
        # time depends on the machine, and another choice would not match the store
        from .config import config_from_dict

        cfg = config_from_dict(dict(cfg.to_dict(), statistics=kept), base_dir=cfg.base_dir)
    run_plan = _plan_fit(cfg, method, setting, width, options, samples, _planned_workers(client, workers))
    memory = None
    if "statistics" not in cfg.model_fields_set:
        from .config import config_from_dict

        mod = method_module(method)
        if hasattr(mod, "DENSE_FAMILIES"):  # what the dense families need of a worker, beside the time
            from .pipeline.plan import plan_families

            memory = plan_families(
                cfg.source.d, mod.DENSE_FAMILIES, mod.sketch_rank(cfg.source.d, width), cfg.run.worker_memory, k=width
            )
        cfg = config_from_dict(dict(cfg.to_dict(), statistics=run_plan.statistics), base_dir=cfg.base_dir)
    if dry_run:
        return {"method": method, "dry_run": True, "plan": run_plan.to_dict(), "plan_lines": run_plan.lines()}
    if progress is not None:
        print(run_plan.summary(), file=progress)

    projected = {p.name: p.projected_seconds for p in run_plan.passes}

    def run(c: Any, lease: Any) -> dict[str, Any]:
        summary = _estimate(
            cfg, store, samples=samples, client=c, progress=progress, lease=lease, projected=projected.get("estimate")
        )
        result = _learn_with(c, store, method, options, out, progress, break_lock, projected=projected)
        result["estimate"] = summary.to_dict()
        result["plan"] = run_plan.to_dict()
        if memory is not None:
            result["statistics_plan"] = memory
        return result

    with writing(store, break_lock=break_lock) as lease:  # before a cluster starts: a refusal is immediate
        if client == "local":
            return run(None, lease)
        if client is not None:
            prepare(client)
            return run(client, lease)
        with connect(workers=workers, scheduler=scheduler, dashboard_address=dashboard or cfg.run.dashboard) as c:
            return run(c, lease)


def _stored_statistics(store: str) -> dict | None:
    """The statistics section of the run already committed at ``store`` (None: no run there yet, or a store
    that cannot be read, which the run itself then reports)."""
    try:
        meta = RunStore(store).meta()
    except (StoreError, OSError, ValueError):
        return None
    if not meta or "config" not in meta:
        return None
    return dict(meta["config"].get("statistics") or {}) or None


def _planned_workers(client: Any, workers: int | None) -> int:
    """Workers a run will have: 1 in process, a client's current workers, else the local cluster's."""
    import os

    if client == "local":
        return 1
    if client is not None:
        return max(1, len(client.scheduler_info().get("workers", {})))
    return int(workers or os.cpu_count() or 1)


def _plan_fit(
    cfg: RunConfig,
    method: str,
    setting: Any,
    width: int | None,
    options: dict[str, Any],
    samples: int | None,
    workers: int,
) -> Any:
    """The plan of a fit (:func:`relulearn.runplan.plan_run`) with the method's statistics options."""
    from .runplan import plan_run

    extra = {k: options.get(k) for k in METHODS[method].fit_options}
    extra.update({k: getattr(setting, k, None) for k in METHODS[method].source_options})
    return plan_run(
        cfg,
        method,
        width=width,
        samples=samples,
        workers=workers,
        extra=extra,
        outputs=getattr(setting, "outputs", None),
    )


def plan(
    config: str | Path | RunConfig,
    method: str | None = None,
    *,
    samples: int | None = None,
    width: int | None = None,
    workers: int | None = None,
    **method_options: Any,
) -> dict[str, Any]:
    """The plan of ``relulearn fit`` (``method`` given) or ``relulearn estimate`` (no method) for a configuration,
    without any work: each pass, each family's form, flops and bytes per sample, projected wall time on
    ``workers`` (default: one per core) and memory per worker and on the driver.

    Returns the plan as a dict (:meth:`relulearn.runplan.RunPlan.to_dict`: ``projected_seconds`` for the whole
    command, one per pass) with ``lines``, the plan as a person reads it.
    """
    from .runplan import plan_run

    cfg = config if isinstance(config, RunConfig) else load_config(config)
    n_workers = _planned_workers(None, workers)
    if method is None:
        got = plan_run(cfg, None, samples=samples, workers=n_workers)
    else:
        options = _options(method, width=width, **method_options)
        setting = _setting_source(cfg)
        _check_setting(method, setting, options)
        got = _plan_fit(cfg, method, setting, width, options, samples, n_workers)
    return dict(got.to_dict(), lines=got.lines())


def evaluate(model: str | Path | Network, teacher: str | Path, *, samples: int = 200_000) -> dict[str, Any]:
    """Relative test error ``E[|y − f̂(x)|²] / E[|y|²]`` on fresh samples (per output too, for
    vector labels); the largest principal angle between the subspace a scalar ReLU teacher
    depends on (row space of its first layer) and the one the model depends on
    (:func:`relulearn.network.subspace_angle`); and the parameter error up to the networks'
    symmetries: permutation and positive rescaling of hidden units, for one-hidden-layer ReLU
    networks with one output (:func:`~relulearn.network.compare`) and for two-layer networks
    ``U f(V x)`` with ``f = max(z, 0)^c`` and any number of outputs, where rescaling ``v_i`` by
    ``s`` scales ``u_i`` by ``s^{-c}`` (:func:`~relulearn.network.compare_two_layer`).

    ``teacher`` is a run configuration (its source, noise included, with samples from a
    stream the estimation never uses) or a network ``.npz`` (noiseless, every output).
    """
    from .network import compare, compare_two_layer, subspace_angle
    from .pipeline.sources import Stream, TeacherSource, draw, make_source
    from .polynomial import PolynomialModel, load_model

    net = model if isinstance(model, (Network, PolynomialModel)) else load_model(model)
    teacher = Path(teacher)
    source: RunSource
    if teacher.suffix == ".npz":
        source, seed = TeacherSource(Network.load(teacher)), 0
    elif teacher.suffix.lower() in (".yaml", ".yml", ".json", ""):
        cfg = load_config(teacher)
        source, seed = make_source(cfg), cfg.seed
    else:
        raise ConfigError(
            f"teacher {teacher}: a {teacher.suffix} file is not a teacher; give a network file (.npz) "
            "or a run configuration (.yaml) whose source is the teacher (an ONNX model or a callable "
            "goes in its `teacher:` section)"
        )
    if net.input_dim != source.d:
        raise ValueError(f"the model has input dimension {net.input_dim} but the teacher has {source.d}")
    if data_of(source) is not None:  # data: its last rows, raw (the model maps raw inputs)
        samples = min(samples, cast("DataSource", source).rows)
        x, y = cast("DataSource", source).test_rows(samples)
    else:
        x, y = draw(source, seed, Stream.TEST, samples)
    y2 = y.reshape(len(y), -1)
    if net.output_dim != y2.shape[1]:
        raise ValueError(
            f"the model has {net.output_dim} outputs but the teacher's labels have {y2.shape[1]}; "
            "learn a model of the same source (or set source.output to compare one output)"
        )
    pred = net.forward(x)
    err2, ey2 = np.mean((y2 - pred) ** 2, axis=0), np.mean(y2**2, axis=0)
    out: dict[str, Any] = {
        "samples": samples,
        "relative_test_error": float(err2.sum() / ey2.sum()),
        "noise_floor": float(y2.shape[1] * source.noise_std**2 / ey2.sum()),
    }
    if getattr(source, "precision", None) == "float32":
        # an ONNX model in float32 sees its inputs rounded to float32 and answers in float32: a learned
        # float64 network can match it only to that level
        out.update(teacher_precision="float32", teacher_relative_rounding=2.0**-24)
    t_net = getattr(source, "network", None)  # None for a black-box teacher
    if t_net is not None:
        out.update(teacher_width=int(t_net.weights[0].shape[0]), teacher_depth=int(t_net.depth))
    if y2.shape[1] > 1:
        out["outputs"] = int(y2.shape[1])
        out["relative_test_error_per_output"] = [float(e) for e in err2 / ey2]
    if isinstance(net, PolynomialModel):
        # an improper model: no weights to compare, no first layer whose span could be measured
        out.update(
            {
                "model_kind": "polynomial",
                "model_degree": net.degree,
                "model_subspace_rank": None if net.basis is None else net.dim,
                "parameter_error": None,
                "parameter_error_note": "the model is a polynomial (improper learner): compare by test error",
            }
        )
        return out
    out.update({"model_kind": "network", "model_width": int(net.weights[0].shape[0]), "model_depth": int(net.depth)})
    if t_net is None and data_of(source) is not None:
        out["parameter_error"] = None
        out["parameter_error_note"] = (
            f"the source is data: the test error is on its last {samples:,} rows (held out "
            "only if the run used fewer rows); no teacher weights to compare with"
        )
        return out
    if t_net is None:
        out["parameter_error"] = None
        out["parameter_error_note"] = (
            f"the teacher is a black box ({getattr(source, 'label', 'no weights')}): no "
            "weights to compare with; compare by test error"
        )
        return out
    scalar_relu = (
        t_net.activation == "relu"
        and net.activation == "relu"
        and y2.shape[1] == 1
        and getattr(source, "output", None) is None
    )
    if scalar_relu and t_net.biases is None:
        # the subspace the teacher depends on against the one the model depends on (π/2: a direction is missing)
        out["subspace_angle"] = subspace_angle(t_net, net, x[:20_000])
    if getattr(source, "output", None) is not None:
        out["parameter_error"] = None
        out["parameter_error_note"] = (
            "the label is one output of a vector-output teacher; parameter errors compare "
            "whole networks (compare by test error)"
        )
        return out
    try:
        cmp = compare(t_net, net) if scalar_relu else compare_two_layer(t_net, net)
        out["parameter_error"] = cmp.relative_error
        out["matching"] = list(cmp.matching)
        out["unit_errors"] = list(cmp.unit_errors)
        if scalar_relu:
            # teacher units left without a learned unit were merged into the nearest one
            u_t = t_net.weights[0] / np.linalg.norm(t_net.weights[0], axis=1, keepdims=True)
            u_l = net.weights[0] / np.linalg.norm(net.weights[0], axis=1, keepdims=True)
            out["merged_teacher_units"] = [
                {
                    "teacher_unit": i,
                    "into_learned_unit": int(np.argmax(u_l @ u_t[i])),
                    "angle": float(np.arccos(np.clip(np.max(u_l @ u_t[i]), -1.0, 1.0))),
                }
                for i, j in enumerate(cmp.matching)
                if j < 0
            ]
    except ValueError as err:
        out["parameter_error"] = None
        out["parameter_error_note"] = str(err)
    return out


def predict(model: str | Path, inputs: str | Path, out: str | Path | None = None) -> dict[str, Any]:
    """Evaluate a model file of any kind (network or polynomial) on the rows of ``inputs`` (``.npy``,
    n × d) and write the predictions to ``out`` (``.npy``: shape (n,) for one output, (n, m) for m).

    Returns the model kind, the shapes and the path written.
    """
    from .polynomial import load_model

    t0 = time.perf_counter()
    net = load_model(model)
    x = _load_matrix(inputs, "inputs")
    if x.shape[1] != net.input_dim:
        raise ValueError(
            f"inputs {inputs} have {x.shape[1]} columns but the model {model} takes d = {net.input_dim} "
            f"inputs; give an n × {net.input_dim} array (one sample per row)"
        )
    y = net.forward(x)
    y = y[:, 0] if y.shape[1] == 1 else y
    if out is not None:
        np.save(Path(out), y)
    return {
        "model": str(model),
        "kind": _model_shape(net)["kind"],
        "samples": int(x.shape[0]),
        "input_dim": int(x.shape[1]),
        "outputs": int(net.output_dim),
        "out": None if out is None else str(out),
        "seconds": time.perf_counter() - t0,
    }


def _load_matrix(path: str | Path, what: str) -> np.ndarray:
    """A 2-d float array from a ``.npy`` file (a vector becomes one column), or an error naming the file."""
    path = Path(path)
    try:
        arr = np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise ValueError(f"{what} file {path} does not exist") from None
    except (OSError, ValueError) as err:
        try:
            with open(path, "rb") as fh:
                head = fh.read(6)
        except OSError:  # a folder, no permission: the error says it
            head = b"\x93NUMPY"
        if head != b"\x93NUMPY":  # np.load reads any other bytes as a pickle, and says so
            raise ValueError(
                f"{what} file {path} is not a .npy file (it lacks numpy's header); save the array with "
                "np.save(PATH, x) and give that file"
            ) from None
        raise ValueError(f"{what} file {path} is not a readable .npy array of numbers: {err}") from None
    if not isinstance(arr, np.ndarray) or arr.ndim not in (1, 2) or not np.issubdtype(arr.dtype, np.number):
        raise ValueError(
            f"{what} file {path} must hold a 1-d or 2-d numeric array, got "
            f"{getattr(arr, 'shape', '?')} of {getattr(arr, 'dtype', type(arr).__name__)}"
        )
    arr = np.asarray(arr, dtype=np.float64)
    arr = arr[:, None] if arr.ndim == 1 else arr
    bad = ~np.isfinite(arr)
    if bad.any():
        r, c = (int(i[0]) for i in np.nonzero(bad))
        raise ValueError(f"{what} file {path} has a non-finite value at row {r}, column {c}")
    return arr


def exact_arbitrary(
    inputs: str | Path, labels: str | Path, width: int, *, activation: str = "relu", out: str | None = None
) -> dict[str, Any]:
    """Recover ``A = U f(V X)`` exactly from arbitrary inputs (files ``inputs`` X, n × d, and
    ``labels`` A, n × m, ``.npy``) with :func:`relulearn.estimators.exact.recover`; write the
    network to ``out``. Returns the width, shapes, the check on the given samples and the report."""
    from .estimators import exact

    t0 = time.perf_counter()
    x, a = _load_matrix(inputs, "inputs"), _load_matrix(labels, "labels")
    if len(x) != len(a):
        raise ValueError(
            f"inputs {inputs} have {len(x)} rows but labels {labels} have {len(a)}; one label row per input row"
        )
    result = exact.recover(x, a, width, activation=activation)
    net = cast(Network, result.network)  # (a network: only the polynomial method learns another model)
    if out is not None:
        net.save(out)
    pred = net.forward(x)
    return {
        "out": out,
        "samples": int(len(x)),
        "input_dim": int(x.shape[1]),
        "outputs": int(a.shape[1]),
        "width": int(net.weights[0].shape[0]),
        "activation": activation,
        "relative_error": float(np.sum((a - pred) ** 2) / max(np.sum(a**2), 1e-300)),
        "seconds": time.perf_counter() - t0,
        "report": result.report,
    }


def demo(
    *,
    d: int = 20,
    width: int = 3,
    samples: int = 1_000_000,
    seed: int = 0,
    store: str | None = None,
    workers: int | None = None,
    scheduler: str | None = None,
    client: Any = None,
    progress: TextIO | None = sys.stderr,
    dashboard: str | None = None,
) -> dict[str, Any]:
    """Plant a one-hidden-layer ReLU network, estimate, learn, polish, evaluate.

    Returns the teacher's and the learned network's units side by side (matched up to
    permutation and positive rescaling), the errors, and the time of each step.
    """
    import tempfile

    from .config import config_from_dict
    from .network import compare
    from .pipeline.sources import make_source

    cfg = config_from_dict(
        {
            "seed": seed,
            "samples": samples,
            "chunk_size": 50_000,
            "source": {"d": d, "teacher": {"kind": "one_hidden_relu", "width": width, "seed": seed}},
            "run": {"commit_interval": 30},
        }
    )
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="relulearn-demo-") as tmp:
        url = store or str(Path(tmp) / "demo.zarr")
        model = str(Path(tmp) / "model.npz")
        fitted = fit(
            cfg,
            url,
            "moments",
            out=model,
            workers=workers,
            scheduler=scheduler,
            client=client,
            progress=progress,
            dashboard=dashboard,
        )
        learned = Network.load(model)
    teacher = cast("TeacherSource", make_source(cfg)).network
    cmp = compare(teacher, learned)
    from .pipeline.sources import Stream, draw

    x, y = draw(make_source(cfg), seed, Stream.TEST, 200_000)
    rel = float(np.mean((y - learned.forward(x)[:, 0]) ** 2) / np.mean(y**2))
    units = []
    u_t, lam_t = teacher.weights[0], teacher.weights[1][0]
    u_l, lam_l = learned.weights[0], learned.weights[1][0]
    for i, j in enumerate(cmp.matching):
        row = {
            "unit": i,
            "teacher_lambda": float(lam_t[i]),
            "learned_lambda": None,
            "angle": None,
            "relative_error": cmp.unit_errors[i],
        }
        if j >= 0:
            scale = float(np.linalg.norm(u_l[j]))
            row["learned_lambda"] = float(lam_l[j] * scale)
            a, b = u_l[j] / scale, u_t[i] / np.linalg.norm(u_t[i])
            # atan2 of sine and cosine stays accurate for tiny angles (arccos does not)
            row["angle"] = float(np.arctan2(np.linalg.norm(a - (a @ b) * b), a @ b))
        units.append(row)
    return {
        "d": d,
        "width": width,
        "samples": fitted["samples"],
        "parameter_error": cmp.relative_error,
        "relative_test_error": rel,
        "units": units,
        "seconds": time.perf_counter() - t0,
        "estimate_seconds": fitted["estimate"]["seconds"],
        "learn_seconds": fitted["seconds"],
        "passes": fitted["passes"],
        "merged_units": fitted["report"].get("merged_units", []),
    }


# ------------------------------------------------------------------ shadow networks


def shadow(teacher: str | Path | Network, degree: int, *, samples: int = 200_000, seed: int = 0) -> dict[str, Any]:
    """How far a network is from its shadow ``Ψ_n`` (Daniely–Srebro–Vardi 2023), next to the bound.

    ``teacher`` is a network ``.npz`` or a run configuration (YAML; its teacher, e.g. a
    ``random_xavier`` one, and its ``source.output`` for a vector-output teacher). Returns
    :func:`relulearn.shadow.shadow_report` (``samples`` fresh Gaussian inputs of stream ``TEST``,
    seed ``seed``) plus ``teacher``.

    Raises
    ------
    ValueError
        A missing or unreadable file, a degree outside ``0..MAX_DEGREE``, or a network the shadow
        does not apply to (biases, another activation), with the cause and the fix.
    """
    from .pipeline.sources import make_source
    from .shadow import shadow_report

    net: Network | None
    if isinstance(teacher, Network):
        net, name = teacher, "network"
    else:
        path = Path(teacher)
        if not path.is_file():
            raise ValueError(
                f"{path} does not exist (or is not a file); give a network file (.npz) or a run "
                "configuration (.yaml) whose source.teacher to compare with its shadow"
            )
        if path.suffix == ".npz":
            net = Network.load(path)
        else:
            cfg = load_config(path)
            source = make_source(cfg)
            net = getattr(source, "network", None)
            if net is None:
                raise ValueError(
                    f"{path}: shadow needs the teacher's weights (a planted or file teacher), but "
                    f"{getattr(source, 'label', 'its teacher')} is a black box"
                )
            if cfg.source.output is not None:  # the scalar label the configuration learns
                net = Network(
                    net.weights[:-1] + (net.weights[-1][cfg.source.output : cfg.source.output + 1],),
                    None
                    if net.biases is None
                    else net.biases[:-1] + (net.biases[-1][cfg.source.output : cfg.source.output + 1],),
                    net.activation,
                )
        name = str(path)
    return {"teacher": name, **shadow_report(net, degree, samples=samples, seed=seed)}


__all__ += ["shadow"]
