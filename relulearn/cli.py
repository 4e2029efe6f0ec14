"""The ``relulearn`` command line: argument parsing and printing only; the work is in :mod:`relulearn.api`."""

from __future__ import annotations

import argparse
import json
import math
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from . import __version__
from .errors import MissingDependencyError
from .methods import METHODS, OPTIONS
from .storage.errors import RESTORE_HINT, StoreError

# the library (numpy, zarr, dask, the methods: most of a second to import) is imported by `_load` once the
# arguments are read and a locked store has been refused: a second writer is turned away at once
api: Any = None
ConfigError: type[Exception] = StoreError
NetworkFileError: type[Exception] = StoreError
ClusterLostError: type[Exception] = StoreError
SourceDataError: type[Exception] = StoreError
summary_lines: Any = None
write_text: Any = None


def _load() -> None:
    """Import the library into this module's names (see above)."""
    global api, ConfigError, NetworkFileError, ClusterLostError, SourceDataError, summary_lines, write_text
    from . import api as api_
    from .atomic import write_text as write_text_
    from .config import ConfigError as config_error
    from .network import NetworkFileError as network_file_error
    from .pipeline.cluster import ClusterLostError as cluster_lost
    from .pipeline.sources import SourceDataError as source_data_error
    from .summary import summary_lines as summary_lines_

    api, write_text, summary_lines = api_, write_text_, summary_lines_
    ConfigError, NetworkFileError, ClusterLostError, SourceDataError = (
        config_error,
        network_file_error,
        cluster_lost,
        source_data_error,
    )


#: the store each writing command writes (the argument naming it)
_WRITES = {"estimate": "store", "fit": "store", "merge": "out"}


def _refuse_if_locked(args: argparse.Namespace) -> None:
    """Raise the lease's refusal before anything is imported or read, when the store a writing command names is a
    local folder whose lease another writer holds (without ``--break-lock``); the command itself refuses the
    same way later, this only makes it immediate."""
    where = _WRITES.get(args.command)
    url = getattr(args, where, None) if where else None
    if url is None or getattr(args, "break_lock", False) or "://" in str(url):
        return
    from .storage.lease import LEASE_KEY, LeaseInfo, StoreLockedError, read_lease

    if not (Path(url) / LEASE_KEY).is_file():
        return
    info = read_lease(str(url))
    if isinstance(info, LeaseInfo):
        raise StoreLockedError(str(url), info, info.stale_reason())


EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130
#: `relulearn verify` found damage (0: intact; 2: no store to verify, or an error)
EXIT_DAMAGED = 1

_EPILOG = """\
examples:
  relulearn estimate examples/small.yaml --store run.zarr          # start or resume
  relulearn estimate examples/small.yaml --store run.zarr --samples 4000000   # extend
  relulearn status run.zarr --json
  relulearn verify run.zarr                                      # check every chunk's checksum
  relulearn merge a.zarr b.zarr --out ab.zarr
  relulearn plan examples/small.yaml --method moments            # passes, forms, projected time
"""


def _whole(minimum: int):
    """An argparse type: a whole number (``1e6`` allowed) of at least ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(float(text)) if "e" in text.lower() else int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        return value

    return parse


_positive, _nonnegative = _whole(1), _whole(0)


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


_BREAK_LOCK_HELP = (
    "break a stale lease on the store: one whose process is no longer running on this host, or "
    "without a heartbeat for RELULEARN_LEASE_TIMEOUT seconds (default 600), as a writer killed with "
    "SIGKILL or on a lost machine leaves; a live lease is never broken"
)
_DASHBOARD_HELP = (
    "HOST:PORT where the local cluster's Dask dashboard listens (default: the config's run.dashboard, "
    "else 127.0.0.1:0, this machine only on a free port). An address on another interface, e.g. "
    "0.0.0.0:8787, lets anyone who reaches this host read the cluster's pages (task names, worker "
    "logs and memory); ignored with --scheduler and --in-process"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relulearn",
        description="Learn hidden neural networks from samples: stream Gaussian samples through Dask into a "
        "zarr store of sufficient statistics (Hermite moments, contracted and filtered second moments, "
        "each with its standard error).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"relulearn {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "estimate",
        help="start, resume or extend a run: accumulate statistics into a store",
        description="Accumulate the statistics a configuration asks for into a zarr store. Running the same "
        "command again resumes an interrupted run (bitwise identical to an uninterrupted one); a larger "
        "--samples extends a finished run. A store made with a different configuration is refused.",
    )
    p.add_argument("config", help="run configuration (YAML; see examples/ and docs/design.md §8)")
    p.add_argument("--store", required=True, help="store location: a directory or an fsspec URL")
    p.add_argument("--samples", type=_positive, help="total samples wanted (default: the config's `samples`)")
    where = p.add_mutually_exclusive_group()
    where.add_argument(
        "--workers", type=_positive, help="worker processes of the local cluster (default: one per core)"
    )
    where.add_argument(
        "--scheduler",
        help="address of a running Dask scheduler (tcp://host:8786) or the file written by "
        "`dask scheduler --scheduler-file FILE` (waited for up to RELULEARN_CONNECT_TIMEOUT s); "
        "default: DASK_SCHEDULER_ADDRESS if set, else a local cluster. Workers must run the "
        "driver's relulearn version (checked before any block)",
    )
    where.add_argument(
        "--in-process",
        action="store_true",
        help="run the blocks in this process without Dask (same results, no parallelism)",
    )
    p.add_argument(
        "--commit-interval",
        type=_non_negative_float,
        help="seconds between commits (default: the config's run.commit_interval, 30)",
    )
    p.add_argument("--break-lock", action="store_true", help=_BREAK_LOCK_HELP)
    p.add_argument(
        "--new-store-here",
        action="store_true",
        help="start a new store in a folder that is not a readable store: other files there are left "
        "as they are; the data of a relulearn store whose root metadata is missing or damaged is moved "
        "into STORE/set-aside-<time>/, never deleted (a readable store is resumed as without it)",
    )
    p.add_argument("--dashboard", metavar="HOST:PORT", help=_DASHBOARD_HELP)
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON on stdout")

    p = sub.add_parser(
        "status",
        help="what a store holds",
        description="Show what a store holds: samples committed, statistics, fingerprint, last commit.",
    )
    p.add_argument("store", help="store location")
    p.add_argument("--json", action="store_true", help="print as JSON")

    p = sub.add_parser(
        "verify",
        help="check every chunk of a store against its checksums",
        description="Check the store's root metadata against its digest, and every chunk and "
        "metadata document of its committed generation (statistics and ledger, then each extra "
        "pass under STORE/passes/) against the commit's manifest: a missing, truncated or altered "
        "chunk (crc32c, sha256) is named with its array and file. Nothing is written. Exit code: "
        "0 intact, 1 damaged, 2 no store to verify (or another error). A store written before "
        "checksums is checked for missing and truncated chunks only.",
    )
    p.add_argument("store", help="store location")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser(
        "report",
        help="an HTML report of a store: spectra, τ grid, learning curves, units",
        description="Write one self-contained HTML file with PNG figures: the eigenvalue spectra of "
        "the stored second-moment families with error bars and noise floor, the τ grid with "
        "P[|y| > τ], the learning curves of the last learn on the store, learned vs teacher units "
        "(--model and --teacher), and the held-out loss of every learn against the samples as the "
        "store was extended. A figure whose inputs are missing is replaced by a line saying what "
        "would draw it. Needs matplotlib (pip install 'relulearn[report]').",
    )
    p.add_argument("store", help="store location")
    p.add_argument("--model", help="a learned network (.npz) to compare with --teacher")
    p.add_argument(
        "--teacher", help="the teacher: a network .npz or a run configuration with a planted or file teacher"
    )
    p.add_argument("--out", required=True, help="where to write the HTML file")
    p.add_argument("--json", action="store_true", help="print what was drawn as JSON")

    p = sub.add_parser(
        "merge",
        help="merge two stores of the same source with different seeds",
        description="Merge two runs of the same source and statistics that used different seeds "
        "into a new store whose statistics cover both runs' samples.",
    )
    p.add_argument("a", help="first store")
    p.add_argument("b", help="second store")
    p.add_argument("--out", required=True, help="location of the new merged store")
    p.add_argument("--break-lock", action="store_true", help=_BREAK_LOCK_HELP.replace("the store", "the --out store"))
    p.add_argument("--json", action="store_true", help="print as JSON")

    def add_cluster_options(q: argparse.ArgumentParser) -> None:
        w = q.add_mutually_exclusive_group()
        w.add_argument(
            "--workers", type=_positive, help="worker processes of the local cluster (default: one per core)"
        )
        w.add_argument(
            "--scheduler",
            help="address of a running Dask scheduler or a scheduler file; estimation, "
            "candidate batches and extra passes all run there (default: DASK_SCHEDULER_ADDRESS if set, "
            "else a local cluster)",
        )
        w.add_argument("--in-process", action="store_true", help="run everything in this process without Dask")
        q.add_argument("--dashboard", metavar="HOST:PORT", help=_DASHBOARD_HELP)

    def add_learn_options(q: argparse.ArgumentParser) -> None:
        q.add_argument(
            "--method",
            default="moments",
            choices=list(METHODS),
            help="learning method (default moments): " + "; ".join(f"{m.name} = {m.summary}" for m in METHODS.values()),
        )
        add_method_options(q)
        q.add_argument(
            "--out",
            help="where to write the learned model (.npz: a network, or a polynomial model for "
            "--method polynomial); required but with fit --dry-run",
        )
        add_cluster_options(q)
        q.add_argument(
            "--break-lock",
            action="store_true",
            help=_BREAK_LOCK_HELP + "; learn: on the stores of the "
            "extra passes it writes (learn only reads STORE), fit: on STORE and those",
        )
        q.add_argument("--quiet", action="store_true", help="no progress output")
        q.add_argument("--json", action="store_true", help="print the full result as JSON (default: a short summary)")
        add_report_option(q)

    p = sub.add_parser(
        "learn",
        help="learn a model (a network, or a polynomial) from a store's statistics",
        description="Learn a network from the statistics in a store with a learning method. "
        "Extra passes the method asks for (moments: contracted moments along directions inside the "
        "found subspace; tensor: contracted orders 3-6 inside the subspace, or the full Hermite tensors for networks "
        "wider than d; filtered-pca: residual-filtered matrices of its candidate networks; landscape: the fourth "
        "moment on the subspace of T_2, on residual labels) are "
        "run and stored under STORE/passes/.",
    )
    p.add_argument("store", help="store location")
    add_learn_options(p)

    p = sub.add_parser(
        "fit",
        help="estimate the statistics a method needs, then learn",
        description="Estimate (or resume/extend) a run, then learn a network from it, with the extra "
        "passes the method asks for. A configuration without a `statistics` section gets the "
        "statistics the method needs.",
    )
    p.add_argument("config", help="run configuration (YAML)")
    p.add_argument("--store", required=True, help="store location")
    p.add_argument("--samples", type=_positive, help="total samples (default: the config's `samples`)")
    p.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (as `relulearn plan CONFIG --method M` does) and stop: nothing is written",
    )
    add_learn_options(p)

    p = sub.add_parser(
        "plan",
        help="the plan of a run before any work: passes, forms, projected time and memory",
        description="Show what `relulearn fit CONFIG --method M` (or `relulearn estimate CONFIG`, "
        "without --method) would do, before any work: each pass, each statistic family with its form "
        "(dense, or sketched with its rank), flops and bytes per sample, the projected wall time on "
        "this machine and the memory per worker and on the driver, and where the time goes "
        "(generation, teacher, update, merge, commit, pilot). The projection prices each family's "
        "work by rates measured once on this machine (a few products, normals and a write: about "
        "two seconds, cached in ~/.cache/relulearn or $RELULEARN_CACHE); a black-box teacher or a "
        "data file is timed on one batch. The learning after the passes is not projected.",
    )
    p.add_argument("config", help="run configuration (YAML)")
    p.add_argument(
        "--method",
        choices=list(METHODS),
        help="plan `fit` with this method: a configuration without a `statistics` section gets the "
        "method's statistics, dense or sketched, whichever is projected faster within "
        "run.worker_memory (default: plan `estimate` of the configured statistics)",
    )
    p.add_argument("--samples", type=_positive, help="samples per pass (default: the config's `samples`)")
    p.add_argument("--width", type=_positive, help="hidden units wanted (as for fit; the sketch's rank grows with it)")
    p.add_argument(
        "--workers", type=_positive, help="workers of the cluster (default: one per core, as a local cluster starts)"
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the plan as JSON (projected_seconds for the whole command and for each pass)",
    )

    p = sub.add_parser(
        "exact-arbitrary",
        help="recover a two-layer rectified net exactly from arbitrary inputs",
        description="Recover A = U f(V X) exactly from samples with arbitrary (non-Gaussian) inputs X, "
        "by enumerating the zero patterns realisable in the row span of A (Bakshi–Jayaram–Woodruff's "
        "n^O(k) algorithm). Needs rank(A) = k and small k (at most 3 with a few hundred samples); "
        "labels must be noiseless.",
    )
    p.add_argument("inputs", help="inputs X (.npy, n rows × d columns)")
    p.add_argument("labels", help="labels A (.npy, n rows × m outputs, or a vector of n labels)")
    p.add_argument("--width", type=_positive, required=True, help="hidden units k")
    p.add_argument(
        "--activation",
        choices=["relu", "relu2", "relu3"],
        default="relu",
        help="the rectified activation f(z) = max(z,0)^c (default relu)",
    )
    p.add_argument("--out", required=True, help="where to write the recovered network (.npz)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser(
        "predict",
        help="evaluate a model file on inputs from a .npy file",
        description="Predictions of a model file of any kind (a network, or a polynomial model from "
        "--method polynomial) at the rows of an n × d .npy array; written as .npy: shape (n,) for one "
        "output, (n, m) for m outputs.",
    )
    p.add_argument("model", help="model file (.npz)")
    p.add_argument("--input", required=True, help="inputs X (.npy, n rows × d columns)")
    p.add_argument("--out", required=True, help="where to write the predictions (.npy)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser(
        "evaluate",
        help="test error of a model against a teacher",
        description="Relative test error E[(y - f(x))^2] / E[y^2] on fresh samples (a stream never "
        "used for estimation), the angle between the subspace the teacher depends on and the one the "
        "model depends on, and for one-hidden-layer ReLU networks the parameter error up to "
        "permutation and positive rescaling of hidden units.",
    )
    p.add_argument("model", help="model file (.npz): a network or a polynomial model")
    p.add_argument(
        "--teacher", required=True, help="a run configuration (its source, noise included) or a network .npz"
    )
    p.add_argument("--samples", type=_positive, default=200_000, help="test samples (default 200000)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser(
        "shadow",
        help="distance of a network from its Hermite-truncated shadow, next to the bound",
        description="Replace each hidden activation of a network (relu, erf, erf_relu, tanh; no biases) "
        "by its degree-n Hermite truncation — the shadow network of Daniely–Srebro–Vardi (2023), a "
        "polynomial of degree n^(depth-1) — and measure E(N − Ψ_n)² on fresh Gaussian inputs, next to "
        "ε_σ(n) and the bound Σ_j Lip^(i−1−j) sqrt(ε̄_j(n)) for random Xavier networks of depth i (see "
        "relulearn.shadow; a random_xavier teacher is such a network).",
    )
    p.add_argument("teacher", help="a network file (.npz) or a run configuration (YAML) whose teacher to use")
    p.add_argument("--degree", type=int, required=True, help="degree n of the Hermite truncation (0..100)")
    p.add_argument("--samples", type=_positive, default=200_000, help="Gaussian inputs (default 200000)")
    p.add_argument("--seed", type=int, default=0, help="seed of the inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")

    p = sub.add_parser(
        "demo",
        help="plant a network, estimate, learn, polish, evaluate",
        description="The end-to-end demonstration: plant a one-hidden-layer ReLU network with "
        "random-sign output weights, estimate its moments on a local cluster, learn it back, "
        "polish, evaluate, and print teacher and learned units side by side.",
    )
    p.add_argument("--d", type=_positive, default=20, help="input dimension (default 20)")
    p.add_argument("--width", type=_positive, default=3, help="hidden units of the planted network (default 3)")
    p.add_argument("--samples", type=_positive, default=1_000_000, help="samples to estimate on (default 1e6)")
    p.add_argument("--seed", type=int, default=0, help="seed of the teacher and of the run (default 0)")
    add_cluster_options(p)
    p.add_argument("--quiet", action="store_true", help="no progress output")
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_report_option(p)
    return parser


def _option_help(name: str) -> str:
    """What option ``name`` does for each method that takes it, methods saying the same thing together."""
    said: dict[str, list[str]] = {}
    for m in METHODS.values():
        if name in m.options:
            said.setdefault(m.options[name], []).append(m.name)
    return "; ".join(f"{', '.join(names)}: {text}" for text, names in said.items())


def add_method_options(q: argparse.ArgumentParser) -> None:
    """The methods' options (:data:`relulearn.methods.OPTIONS`), each with what it does for each method."""
    g = q.add_argument_group("method options", "each applies to the methods it names; others refuse it")
    for o in OPTIONS.values():
        kwargs: dict[str, Any] = {"help": _option_help(o.name)}
        if o.kind in ("count", "count0"):
            kwargs["type"] = _positive if o.kind == "count" else _nonnegative
        elif o.kind == "choice":
            kwargs["choices"] = list(o.choices)
        elif o.kind == "yes_no":
            kwargs.update(action=argparse.BooleanOptionalAction, default=None)
        elif o.kind == "switch":
            kwargs.update(action="store_true", default=None)
        else:  # switch_off
            kwargs.update(dest=o.name, action="store_false", default=None)
        g.add_argument(o.flag, **kwargs)


def add_report_option(p: argparse.ArgumentParser) -> None:
    p.add_argument(
        "--report",
        metavar="PATH",
        help="also write the full result (the --json output) to PATH; its folder must exist (checked before any work)",
    )


def _check_file_path(flag: str, path: str | None, example: str) -> None:
    """Refuse, before a long run, an output file path whose folder does not exist or that is a folder."""
    if path is None:
        return
    p = Path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file path, e.g. {p / example}")
    if not p.parent.is_dir():
        raise ValueError(f"{flag} {path}: the folder {p.parent} does not exist; create it or choose another path")


#: commands whose ``--out`` is a local file written when the work is done, and an example file name
_FILE_OUT = {
    "learn": "model.npz",
    "fit": "model.npz",
    "exact-arbitrary": "model.npz",
    "predict": "predictions.npy",
    "report": "report.html",
}


def _check_output_paths(args: argparse.Namespace) -> None:
    """Every file a command writes after its work, checked before the work starts."""
    _check_file_path("--report", getattr(args, "report", None), "report.json")
    if args.command in ("learn", "fit") and not getattr(args, "dry_run", False) and not args.out:
        raise ConfigError(
            f"relulearn {args.command} needs --out FILE: where to write the learned model (.npz)"
            + (" (or --dry-run to see the plan only)" if args.command == "fit" else "")
        )
    if args.command in _FILE_OUT:
        _check_file_path("--out", getattr(args, "out", None), _FILE_OUT[args.command])


#: what is safe after Ctrl-C, per command (others write nothing, or only the file they were asked for, whole)
_INTERRUPTED: dict[str | None, str] = {
    "estimate": "every merged block was committed. Run the same command to resume.",
    "fit": "every merged block was committed. Run the same command to resume.",
    "learn": "the blocks of the passes it ran were committed; run the same command to continue from them.",
    "merge": "the output store keeps its last commit; run the same command again.",
}


def _write_report(path: str, result: dict[str, Any]) -> None:
    write_text(path, json.dumps(result, indent=2, default=str) + "\n")


def _cluster_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "scheduler": args.scheduler,
        "client": "local" if args.in_process else None,
        "progress": None if args.quiet else sys.stderr,
        "dashboard": _dashboard(args),
    }


def _dashboard(args: argparse.Namespace) -> str | None:
    from .pipeline.cluster import check_dashboard

    return None if args.dashboard is None else check_dashboard(args.dashboard)


def _method_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in OPTIONS}


def _print_demo(result: dict[str, Any]) -> None:
    print(
        f"planted one-hidden-layer ReLU network: d = {result['d']}, width = {result['width']}, "
        f"{result['samples']:,} samples"
    )
    print(f"{'unit':>4}  {'teacher λ':>12}  {'learned λ':>12}  {'angle (rad)':>12}  {'rel. error':>10}")
    for u in result["units"]:
        learned = "—" if u["learned_lambda"] is None else f"{u['learned_lambda']:12.8f}"
        angle = "—" if u["angle"] is None else f"{u['angle']:12.3e}"
        print(f"{u['unit']:>4}  {u['teacher_lambda']:12.8f}  {learned:>12}  {angle:>12}  {u['relative_error']:10.2e}")
    print(f"parameter error (up to symmetries): {result['parameter_error']:.3e}")
    print(f"relative test error:                {result['relative_test_error']:.3e}")
    missing = [u["unit"] for u in result["units"] if u["learned_lambda"] is None]
    if missing and result["merged_units"]:  # merges matter only when a teacher unit did not come out
        print(
            f"teacher unit{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} not found: the search "
            "merged units it could not tell apart at this sample count ("
            + ", ".join(f"into unit {m['into']}: {m['reason']}" for m in result["merged_units"])
            + "); more samples separate them"
        )
    print(
        f"time: estimate {result['estimate_seconds']:.1f} s, learn {result['learn_seconds']:.1f} s, "
        f"total {result['seconds']:.1f} s"
    )


def _print_shadow(r: dict[str, Any]) -> None:
    def pm(value: float, se: float) -> str:
        return f"{value:.4g} ± {se:.2g}"

    rows = [
        ("teacher", r["teacher"]),
        ("activation", f"{r['activation']} (normalised σ, Lipschitz {r['lipschitz']:.4g})"),
        ("depth", f"{r['depth']} weight matrices, hidden widths {r['widths']}, input dimension {r['input_dim']}"),
        ("degree n", f"{r['degree']} (the shadow is a polynomial of degree {r['polynomial_degree']:,})"),
        ("ε_σ(n)", f"{r['epsilon_sigma']:.4g}"),
        ("bound", f"{r['bound']:.4g} (Gaussian inputs; {r['bound_sphere']:.4g} on the paper's sphere)"),
        (
            "distance",
            f"{pm(r['distance'], r['distance_se'])}  (relative to ‖N‖: "
            f"{pm(r['relative_distance'], r['relative_distance_se'])}; scaled: "
            f"{pm(r['scaled_distance'], r['scaled_distance_se'])})",
        ),
    ]
    if "exact_distance_squared" in r:
        agree = abs(r["distance_squared"] - r["exact_distance_squared"]) <= 4 * r["distance_squared_se"]
        rows.append(
            (
                "exact",
                f"{math.sqrt(r['exact_distance_squared']):.4g} for these weights "
                f"(measured agrees within 4 SE: {'yes' if agree else 'no'})",
            )
        )
    ratio = "—" if r["ratio_to_bound"] is None else f"{r['ratio_to_bound']:.3f}"
    if r["within_bound"] is None:
        rows.append(
            (
                "within bound",
                f"— (depth 2: the bound is the mean over random weights, not an upper bound; "
                f"scaled distance / bound = {ratio})",
            )
        )
    else:
        rows.append(("within bound", f"{'yes' if r['within_bound'] else 'no'} (scaled distance / bound = {ratio})"))
    rows.append(
        (
            "samples",
            f"{r['samples']:,} (seed {r['seed']}); pre-activation scales "
            + ", ".join(f"{s:.3f}" for s in r["preactivation_scales"]),
        )
    )
    width = max(len(k) for k, _ in rows)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")


def _print_status(st: dict[str, Any]) -> None:
    state = "complete" if st["complete"] else "incomplete (run `relulearn estimate` with its configuration to resume)"
    print(f"store        {st['store']}")
    print(f"samples      {st['samples']:,} of {st['target_samples'] or st['samples']:,}: {state}")
    damaged = st.get("damaged") or []
    if damaged:
        first = damaged[0]
        where = (
            f"array {first['array']}, chunk {first['chunk']} (file {first['key']})"
            if first["chunk"]
            else f"file {first['key']}"
        )
        print(
            f"DAMAGED      {len(damaged)} object(s) missing or truncated, e.g. {where} {first['problem']}; "
            f"`relulearn verify {st['store']}` names them all; {RESTORE_HINT}"
        )
    print(
        f"chunks       {st['chunks']:,} × {st['chunk_size']:,} samples, in {st['blocks']:,} blocks; "
        f"seeds {', '.join(map(str, st['seeds']))}"
    )
    print(f"statistics   {', '.join(st['statistics'])}")
    print(f"commits      {st['commits']:,} (created {st['created']}, last {st['last_commit']}, head {st['head']})")
    print(
        "checksums    "
        + (
            "crc32c in every chunk, sha256 manifest of the commit (`relulearn verify` checks all)"
            if st.get("checksums")
            else "none (written before checksums; the next commit adds them)"
        )
    )
    platforms = st.get("platforms") or ["unknown"]
    print(f"computed on  {platforms[0]}")
    for p in platforms[1:]:
        print(f"             {p}")
    if st.get("mixed_platforms"):
        print(
            "note: blocks were computed under different numpy versions or BLAS kernels; the sums agree with a "
            "single-platform run within rounding, not bitwise"
        )
    lease = st.get("lease")
    if lease is not None:
        if lease.get("holder") is None:
            print("locked       by a lease whose document cannot be read (stale; --break-lock breaks it)")
        else:
            who = f"process {lease['pid']}" + (f" ({lease['command']})" if lease.get("command") else "")
            print(
                f"locked       by {who} on {lease['host']}, since {lease['started']}, last heartbeat "
                f"{lease['heartbeat']}"
            )
            if lease["stale"]:
                print(f"             stale: {lease['stale']} (the next writer needs --break-lock)")
    print("(the fingerprint and the rest: --json)")


def _print_verify(r: dict[str, Any]) -> None:
    """The table of `relulearn verify`: one row per array (chunks checked, status), then the metadata."""

    def rows(rep: dict[str, Any], prefix: str = "") -> list[tuple[str, str, str]]:
        problems: dict[str, list[str]] = {}
        for d in rep["damaged"]:
            problems.setdefault(d["array"], []).append(
                f"chunk {d['chunk']} ({d['key']}) {d['problem']}" if d["chunk"] else f"{d['key']} {d['problem']}"
            )
        out = [
            (
                prefix + a["array"],
                str(a["chunks"]),
                "ok" if a["status"] == "ok" else "DAMAGED: " + "; ".join(problems.pop(a["array"], ["damaged"])),
            )
            for a in rep["arrays"]
        ]
        for array, found in problems.items():  # metadata documents, the root
            out.append(
                (
                    prefix + ("root metadata" if array == "root" else f"{array} (metadata)"),
                    "-",
                    "DAMAGED: " + "; ".join(found),
                )
            )
        if not any(d["array"] != "root" and not d["chunk"] for d in rep["damaged"]):
            out.append((prefix + "metadata documents", str(rep["documents"]), "ok"))
        if rep["root"] == "ok":
            out.append((prefix + "root metadata", "1", "ok"))
        return out

    checks = (
        "crc32c + sha256 manifest"
        if r["checksums"]
        else "unknown (no readable root metadata)"
        if r["head"] is None
        else "none (written before checksums: missing and truncated chunks only)"
    )
    print(f"store {r['store']}: head {r['head'] or '-'}, checksums {checks}")
    table = rows(r)
    for p in r["passes"]:
        table += rows(p, prefix=p["store"].removeprefix(r["store"].rstrip("/") + "/") + "/")
    width = max(len(a) for a, _, _ in table + [("array", "", "")])
    print(f"{'array':<{width}}  {'chunks':>6}  status")
    for array, chunks, state in table:
        print(f"{array:<{width}}  {chunks:>6}  {state}")
    if r.get("found"):
        print(f"found: {r['found'].removeprefix('it holds ')} (not checked: the manifest was in the root metadata)")
    damaged = r["damaged"] + [d for p in r["passes"] for d in p["damaged"]]
    if r["intact"]:
        print(
            f"intact: {sum(a['chunks'] for a in r['arrays'])} chunks of {len(r['arrays'])} arrays and "
            f"{r['documents']} metadata documents checked in {r['seconds']:.2f} s"
        )
    else:
        arrays = {d["array"] for d in damaged}
        print(f"DAMAGED: {len(damaged)} damaged object(s) in {len(arrays)} array(s) or document(s); {RESTORE_HINT}")


def _format(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3e}" if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e6) else f"{v:,.3f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, list) and len(v) <= 12 and all(isinstance(e, (int, float)) for e in v):
        return "[" + ", ".join(_format(e) for e in v) + "]"
    return str(v)


def _print(result: dict[str, Any], as_json: bool) -> None:
    """JSON, or a short table for people: scalar fields and short lists; the lines of a
    method's ``report["summary"]``; nested parts only named (they are in ``--json``)."""
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return

    def short(v: Any) -> bool:  # a scalar, or a short list of numbers
        return not isinstance(v, (dict, list)) or (
            isinstance(v, list) and 0 < len(v) <= 12 and all(isinstance(e, (int, float)) for e in v)
        )

    rows = [(k, _format(v)) for k, v in result.items() if short(v) and k != "passes"]
    summary = result.get("report", {}).get("summary", {}) if isinstance(result.get("report"), dict) else {}
    rows += [(k, _format(v)) for k, v in summary.items()]
    if result.get("passes"):
        rows.append(("passes", ", ".join(p["name"] for p in result["passes"])))
    width = max((len(k) for k, _ in rows), default=0)
    for k, v in rows:
        print(f"{k:<{width}}  {v}")
    hidden = [k for k, v in result.items() if not short(v) and k != "passes" and v]
    if hidden:
        print(f"(also {', '.join(hidden)}: --json)")


def _cmd_estimate(args: argparse.Namespace) -> dict[str, Any]:
    def on_start(info: dict) -> None:
        if args.quiet:
            return
        if info["dashboard"]:
            print(f"dashboard: {info['dashboard']}", file=sys.stderr)
        if info.get("set_aside"):
            moved = info["set_aside"]
            print(
                f"set aside the damaged store's data ({', '.join(moved['moved'])}) in {moved['folder']}; nothing "
                "was deleted",
                file=sys.stderr,
            )
        verb = "resuming" if info["resumed_from_samples"] else "starting"
        print(
            f"{verb} run in {info['store']}: {info['resumed_from_samples']:,} -> {info['target_samples']:,} "
            f"samples in {info['blocks']} blocks",
            file=sys.stderr,
        )

    client = "local" if args.in_process else None
    summary = api.estimate(
        args.config,
        args.store,
        samples=args.samples,
        workers=args.workers,
        scheduler=args.scheduler,
        client=client,
        commit_interval=args.commit_interval,
        progress=None if args.quiet else sys.stderr,
        on_start=on_start,
        break_lock=args.break_lock,
        dashboard=_dashboard(args),
        new_store_here=args.new_store_here,
    )
    return summary.to_dict()


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        _refuse_if_locked(args)
    except StoreError as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(err), "kind": type(err).__name__}))
        print(f"relulearn: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    _load()
    try:
        _check_output_paths(args)
        if args.command == "estimate":
            result = _cmd_estimate(args)
        elif args.command == "status":
            result = api.status(args.store)
            if not args.json:
                _print_status(result)
                return 0
        elif args.command == "verify":
            result = api.verify(args.store)
            if args.json:
                print(json.dumps(result, indent=2))
            else:
                _print_verify(result)
            sys.stdout.flush()
            return 0 if result["intact"] else EXIT_DAMAGED
        elif args.command == "report":
            from .report import plt, write_report

            plt()  # matplotlib installed, before the store is read

            result = write_report(args.store, args.out, model=args.model, teacher=args.teacher)
            if not args.json:
                print(
                    f"wrote {result['out']} ({result['bytes'] / 1e3:.0f} kB): figures "
                    f"{', '.join(result['figures']) or 'none'}"
                )
                for name, why in result["not_drawn"].items():
                    print(f"  not drawn: {name}: {why}")
                for name, pairs in result["overlaps"].items():
                    print(f"  overlapping text in {name}: {'; '.join(pairs[:3])}")
                return 0
        elif args.command == "merge":
            result = api.merge(args.a, args.b, args.out, break_lock=args.break_lock)
        elif args.command == "learn":
            result = api.learn(
                args.store,
                args.method,
                out=args.out,
                break_lock=args.break_lock,
                **_method_kwargs(args),
                **_cluster_kwargs(args),
            )
        elif args.command == "fit":
            result = api.fit(
                args.config,
                args.store,
                args.method,
                out=args.out,
                samples=args.samples,
                break_lock=args.break_lock,
                dry_run=args.dry_run,
                **_method_kwargs(args),
                **_cluster_kwargs(args),
            )
            if args.dry_run:
                if args.json:
                    print(json.dumps(result["plan"], indent=2))
                else:
                    print("\n".join(result["plan_lines"]))
                return 0
        elif args.command == "plan":
            result = api.plan(args.config, args.method, samples=args.samples, width=args.width, workers=args.workers)
            if args.json:
                print(json.dumps({k: v for k, v in result.items() if k != "lines"}, indent=2))
            else:
                print("\n".join(result["lines"]))
            return 0
        elif args.command == "exact-arbitrary":
            result = api.exact_arbitrary(args.inputs, args.labels, args.width, activation=args.activation, out=args.out)
        elif args.command == "predict":
            result = api.predict(args.model, args.input, args.out)
        elif args.command == "evaluate":
            result = api.evaluate(args.model, args.teacher, samples=args.samples)
        elif args.command == "shadow":
            result = api.shadow(args.teacher, args.degree, samples=args.samples, seed=args.seed)
            if not args.json:
                _print_shadow(result)
                return 0
        elif args.command == "demo":
            result = api.demo(d=args.d, width=args.width, samples=args.samples, seed=args.seed, **_cluster_kwargs(args))
        else:  # pragma: no cover - argparse rejects unknown commands
            parser.error(f"unknown command {args.command}")
        if getattr(args, "report", None):
            _write_report(args.report, result)
    except ClusterLostError as err:
        resume = "relulearn " + shlex.join(sys.argv[1:] if argv is None else list(argv))
        msg = (
            f"{err}. Start the scheduler and workers again (or drop --scheduler for a local cluster) and run "
            f"the same command to resume: {resume}"
        )
        if getattr(args, "json", False):
            print(json.dumps({"error": msg, "kind": type(err).__name__}))
        print(f"relulearn: error: {msg}", file=sys.stderr)
        return EXIT_USER_ERROR
    except (
        ConfigError,
        StoreError,
        NetworkFileError,
        SourceDataError,
        OSError,
        ValueError,
        MissingDependencyError,
    ) as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(err), "kind": type(err).__name__}))
        print(f"relulearn: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print(
            f"relulearn: interrupted; {_INTERRUPTED.get(getattr(args, 'command', None), 'nothing was written')}",
            file=sys.stderr,
        )
        return EXIT_INTERRUPTED
    try:
        if args.command in ("learn", "fit") and not args.json:
            print("\n".join(summary_lines(result)))
        elif args.command == "demo" and not args.json:
            _print_demo(result)
        else:
            _print(result, args.json)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `relulearn status run.zarr | head -3`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
