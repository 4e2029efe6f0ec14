"""The command line's arguments: every subcommand, its options and their help (``relulearn --help``)."""

from __future__ import annotations

import argparse
from typing import Any

from .._version import __version__
from ..methods import METHODS, OPTIONS, option_help

_EPILOG = """\
examples:
  relulearn example small > small.yaml                           # a shipped configuration
  relulearn plan small.yaml --method moments                     # passes, forms, projected time, where
  relulearn estimate small.yaml --store run.zarr                 # start or resume
  relulearn estimate small.yaml --store run.zarr --samples 4000000   # extend
  relulearn learn run.zarr --method moments --out model.npz
  relulearn status run.zarr --json
  relulearn verify run.zarr                                      # check every chunk's checksum
  relulearn merge a.zarr b.zarr --out ab.zarr
  relulearn curve small.yaml --method moments --samples 1e5,3e5,1e6 --plot curve.png   # error vs samples
"""


#: the largest count a command takes: stores keep counts in int64 columns
_MAXIMUM = 2**63 - 1


def _whole(minimum: int):
    """An argparse type: a whole number (``1e6`` allowed) from ``minimum`` to 2^63 - 1."""

    def parse(text: str) -> int:
        try:
            value = int(float(text)) if "e" in text.lower() else int(text)
        except (ValueError, OverflowError):  # OverflowError: 1e999 is inf as a float
            raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
        if value < minimum:
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {value}")
        if value > _MAXIMUM:
            raise argparse.ArgumentTypeError(f"must be at most {_MAXIMUM:,}, got {text}")
        return value

    return parse


_positive, _nonnegative = _whole(1), _whole(0)


def _counts(text: str) -> list[int]:
    """An argparse type: increasing sample counts separated by commas (``1e5,1e6``)."""
    counts = [_positive(part.strip()) for part in text.split(",") if part.strip()]
    if not counts:
        raise argparse.ArgumentTypeError(f"expected sample counts separated by commas, e.g. 1e5,1e6, got {text!r}")
    for a, b in zip(counts, counts[1:]):
        if b <= a:
            raise argparse.ArgumentTypeError(f"sample counts must increase: {a:,} then {b:,}")
    return counts


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


def _dashboard(text: str) -> str:
    """An argparse type: a dashboard address, ``HOST:PORT`` (checked with the arguments, before any file is read)."""
    from ..pipeline.cluster import check_dashboard

    try:
        return check_dashboard(text)
    except ValueError as err:
        raise argparse.ArgumentTypeError(str(err)) from None


_BREAK_LOCK_HELP = (
    "take a stale lease on the store whose holder is unknown (a lease.json that is no writer's document) "
    "or whose heartbeat is in the future; a lease whose process is no longer running on this host, or "
    "without a heartbeat for RELULEARN_LEASE_TIMEOUT seconds (default 600), as a writer killed with "
    "SIGKILL or on a lost machine leaves, is taken over without it; with it, also the lease of a writer on "
    "another host whose heartbeat is recent (that writer, if it still runs, stops at its next commit); a live "
    "lease on this host is never broken"
)
_DASHBOARD_HELP = (
    "HOST:PORT where the local cluster's Dask dashboard listens (default: the config's run.dashboard, "
    "else 127.0.0.1:0, this machine only on a free port). An address on another interface, e.g. "
    "0.0.0.0:8787, lets anyone who reaches this host read the cluster's pages (task names, worker "
    "logs and memory); ignored with --scheduler and --in-process"
)


def build_parser() -> argparse.ArgumentParser:
    """The parser of ``relulearn``: every subcommand with its options (the CLI reference is generated from it)."""
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
    _estimate(sub)
    _status(sub)
    _verify(sub)
    _report(sub)
    _merge(sub)
    _learn(sub)
    _fit(sub)
    _curve(sub)
    _plan(sub)
    _exact_arbitrary(sub)
    _predict(sub)
    _evaluate(sub)
    _shadow(sub)
    _demo(sub)
    _example(sub)
    for p in sub.choices.values():
        add_output_options(p)
    return parser


def add_output_options(p: argparse.ArgumentParser) -> None:
    """``-v``/``--verbose`` and ``-q``/``--quiet``, the same on every command (relulearn.cli.logs)."""
    g = p.add_mutually_exclusive_group()
    g.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=0,
        help="say more on stderr: what the command does (stores opened and committed, files written, workers "
        "checked) and, for verify, every array checked; -vv: also the details (debug)",
    )
    g.add_argument(
        "-q",
        "--quiet",
        action="store_true",
        help="no progress lines and no notices or warnings on stderr: only the result (and errors)",
    )


def _estimate(sub: Any) -> None:
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
        "--workers",
        type=_positive,
        help="run on a local cluster of N worker processes (default: in this process, or a local cluster of one "
        "worker per core when the plan projects it to save more than its start-up)",
    )
    where.add_argument(
        "--scheduler",
        help="address of a running Dask scheduler (tcp://host:8786) or the file written by "
        "`dask scheduler --scheduler-file FILE` (waited for up to RELULEARN_CONNECT_TIMEOUT s); "
        "default: DASK_SCHEDULER_ADDRESS if set, else as the plan chooses. Workers must run the "
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
    p.add_argument("--dashboard", metavar="HOST:PORT", type=_dashboard, help=_DASHBOARD_HELP)
    p.add_argument("--json", action="store_true", help="print the run summary as JSON on stdout")


def _status(sub: Any) -> None:
    p = sub.add_parser(
        "status",
        help="what a store holds",
        description="Show what a store holds: samples committed, statistics, fingerprint, last commit.",
    )
    p.add_argument("store", help="store location")
    p.add_argument("--json", action="store_true", help="print as JSON")


def _verify(sub: Any) -> None:
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


def _report(sub: Any) -> None:
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


def _merge(sub: Any) -> None:
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


def _learn(sub: Any) -> None:
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


def _fit(sub: Any) -> None:
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


def _curve(sub: Any) -> None:
    p = sub.add_parser(
        "curve",
        help="a learning curve: error against samples on one store, with its slope",
        description="Extend one store through increasing sample counts, learn with the method at each, and "
        "measure the model against the configuration's teacher (as `relulearn evaluate` does: parameter error "
        "up to the symmetries, relative test error on fresh samples). Fits the slope of the parameter error "
        "against the samples on log-log axes (least squares over the points above the exact-recovery floor, "
        "1e-10) beside the papers' rate, -1/2 under label noise, and marks the first count recovered exactly. "
        "Each point is recorded in the store: the same command again reuses the points learned and only "
        "extends and learns the rest (an interrupted curve resumes). Without --json prints a table and the "
        "slope.",
    )
    p.add_argument("config", help="run configuration (YAML) whose source is the teacher")
    p.add_argument(
        "--samples",
        type=_counts,
        required=True,
        help="increasing sample counts, separated by commas (1e5,1e6,1e7); each rounded up to whole chunks",
    )
    p.add_argument(
        "--store",
        help="store location: one store extended through the counts (default: CONFIG's name with "
        "-METHOD-curve.zarr, in the current folder)",
    )
    p.add_argument("--out-json", metavar="FILE", help="also write the result (the --json output) to FILE")
    p.add_argument(
        "--plot",
        metavar="FILE.png",
        help="draw the curve to a PNG: errors against samples on log-log axes, the fitted slope, the papers' "
        "rate and the exact-recovery point (needs matplotlib: pip install 'relulearn[report]')",
    )
    p.add_argument(
        "--test-samples",
        type=_positive,
        default=200_000,
        help="fresh samples each model is measured on (default 200000)",
    )
    add_learn_options(p, out=False, report=False)


def _plan(sub: Any) -> None:
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
        "--workers",
        type=_positive,
        help="plan on N workers (default: in process or on one worker per core, as fit and estimate choose)",
    )
    p.add_argument(
        "--json",
        action="store_true",
        help="print the plan as JSON (projected_seconds for the whole command and for each pass)",
    )


def _exact_arbitrary(sub: Any) -> None:
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


def _predict(sub: Any) -> None:
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


def _evaluate(sub: Any) -> None:
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


def _shadow(sub: Any) -> None:
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
    p.add_argument("--seed", type=_nonnegative, default=0, help="seed of the inputs (default 0)")
    p.add_argument("--json", action="store_true", help="print the result as JSON")


def _demo(sub: Any) -> None:
    p = sub.add_parser(
        "demo",
        help="plant a network, estimate, learn, polish, evaluate",
        description="The end-to-end demonstration: plant a one-hidden-layer ReLU network with "
        "random-sign output weights, estimate its moments (in process, or on a local cluster where it pays), "
        "learn it back, polish, evaluate, and print teacher and learned units side by side.",
    )
    p.add_argument("--d", type=_positive, default=20, help="input dimension (default 20)")
    p.add_argument("--width", type=_positive, default=3, help="hidden units of the planted network (default 3)")
    p.add_argument("--samples", type=_positive, default=1_000_000, help="samples to estimate on (default 1e6)")
    p.add_argument("--seed", type=_nonnegative, default=0, help="seed of the teacher and of the run (default 0)")
    add_cluster_options(p)
    p.add_argument("--json", action="store_true", help="print the result as JSON")
    add_report_option(p)


def _example(sub: Any) -> None:
    p = sub.add_parser(
        "example",
        help="list the shipped example configurations, or print one",
        description="Without NAME, list the example configurations shipped with relulearn; with NAME, print "
        "that configuration (its leading comment says the commands to run, their time and their result), "
        "e.g. `relulearn example small > small.yaml`.",
    )
    p.add_argument("name", nargs="?", help="the example to print (default: list them)")
    p.add_argument("--json", action="store_true", help="print the list, or the example's name and text, as JSON")


def add_cluster_options(q: argparse.ArgumentParser) -> None:
    w = q.add_mutually_exclusive_group()
    w.add_argument(
        "--workers",
        type=_positive,
        help="run on a local cluster of N worker processes (default: in this process, or a local cluster of one "
        "worker per core when the plan projects it to save more than its start-up; learn: in this process, a "
        "cluster only for a pass that pays for it)",
    )
    w.add_argument(
        "--scheduler",
        help="address of a running Dask scheduler or a scheduler file; estimation, "
        "candidate batches and extra passes all run there (default: DASK_SCHEDULER_ADDRESS if set, "
        "else as the plan chooses)",
    )
    w.add_argument("--in-process", action="store_true", help="run everything in this process without Dask")
    q.add_argument("--dashboard", metavar="HOST:PORT", type=_dashboard, help=_DASHBOARD_HELP)


def add_learn_options(q: argparse.ArgumentParser, *, out: bool = True, report: bool = True) -> None:
    q.add_argument(
        "--method",
        default="moments",
        choices=list(METHODS),
        help="learning method (default moments): " + "; ".join(f"{m.name} = {m.summary}" for m in METHODS.values()),
    )
    add_method_options(q)
    if out:
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
    q.add_argument("--json", action="store_true", help="print the full result as JSON (default: a short summary)")
    if report:
        add_report_option(q)


def add_method_options(q: argparse.ArgumentParser) -> None:
    """The methods' options (:data:`relulearn.methods.OPTIONS`), each with what it does for each method."""
    g = q.add_argument_group("method options", "each applies to the methods it names; others refuse it")
    for o in OPTIONS.values():
        kwargs: dict[str, Any] = {"help": option_help(o.name)}
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
