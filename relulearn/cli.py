"""The ``relulearn`` command line: argument parsing and printing only; the work is in :mod:`relulearn.api`."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence

from . import api
from .config import ConfigError
from .network import NetworkFileError
from .pipeline.sources import SourceDataError
from .storage import StoreError

EXIT_USER_ERROR = 2
EXIT_INTERRUPTED = 130

_EPILOG = """\
examples:
  relulearn estimate examples/small.yaml --store run.zarr          # start or resume
  relulearn estimate examples/small.yaml --store run.zarr --samples 4000000   # extend
  relulearn status run.zarr --json
  relulearn merge a.zarr b.zarr --out ab.zarr
"""


def _positive(text: str) -> int:
    try:
        value = int(float(text)) if "e" in text.lower() else int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"must be at least 1, got {value}")
    return value


def _non_negative_float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of seconds, got {text!r}") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be non-negative, got {value}")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="relulearn",
        description="Learn hidden neural networks from samples: stream Gaussian samples through Dask into a "
        "zarr store of sufficient statistics (Hermite moments, contracted and filtered second moments, "
        "each with its standard error).",
        epilog=_EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True

    p = sub.add_parser(
        "estimate",
        help="start, resume or extend a run: accumulate statistics into a store",
        description="Accumulate the statistics a configuration asks for into a zarr store. Running the same "
        "command again resumes an interrupted run (bitwise identical to an uninterrupted one); a larger "
        "--samples extends a finished run. A store made with a different configuration is refused.",
    )
    p.add_argument("config", help="run configuration (YAML; see examples/ and DESIGN.md §8)")
    p.add_argument("--store", required=True, help="store location: a directory or an fsspec URL")
    p.add_argument("--samples", type=_positive, help="total samples wanted (default: the config's `samples`)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--workers", type=_positive, help="worker processes of the local cluster (default: one per core)")
    where.add_argument("--scheduler", help="address of a running Dask scheduler (tcp://host:8786) or a scheduler file")
    where.add_argument("--in-process", action="store_true",
                       help="run the blocks in this process without Dask (same results, no parallelism)")
    p.add_argument("--commit-interval", type=_non_negative_float,
                   help="seconds between commits (default: the config's run.commit_interval, 30)")
    p.add_argument("--quiet", action="store_true", help="no progress line")
    p.add_argument("--json", action="store_true", help="print the run summary as JSON on stdout")

    p = sub.add_parser("status", help="what a store holds", description="Show what a store holds: samples "
                       "committed, statistics, fingerprint, last commit.")
    p.add_argument("store", help="store location")
    p.add_argument("--json", action="store_true", help="print as JSON")

    p = sub.add_parser("merge", help="merge two stores of the same source with different seeds",
                       description="Merge two runs of the same source and statistics that used different seeds "
                       "into a new store whose statistics cover both runs' samples.")
    p.add_argument("a", help="first store")
    p.add_argument("b", help="second store")
    p.add_argument("--out", required=True, help="location of the new merged store")
    p.add_argument("--json", action="store_true", help="print as JSON")
    return parser


def _print(result: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return
    width = max(len(k) for k in result)
    for k, v in result.items():
        if isinstance(v, dict):
            v = json.dumps(v)
        elif isinstance(v, float):
            v = f"{v:,.3f}"
        elif isinstance(v, int) and not isinstance(v, bool):
            v = f"{v:,}"
        print(f"{k:<{width}}  {v}")


def _cmd_estimate(args: argparse.Namespace) -> dict[str, Any]:
    def on_start(info: dict) -> None:
        if args.quiet:
            return
        if info["dashboard"]:
            print(f"dashboard: {info['dashboard']}", file=sys.stderr)
        verb = "resuming" if info["resumed_from_samples"] else "starting"
        print(f"{verb} run in {info['store']}: {info['resumed_from_samples']:,} -> {info['target_samples']:,} "
              f"samples in {info['blocks']} blocks", file=sys.stderr)

    client = "local" if args.in_process else None
    summary = api.estimate(args.config, args.store, samples=args.samples, workers=args.workers,
                           scheduler=args.scheduler, client=client, commit_interval=args.commit_interval,
                           progress=None if args.quiet else sys.stderr, on_start=on_start)
    return summary.to_dict()


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        if args.command == "estimate":
            result = _cmd_estimate(args)
        elif args.command == "status":
            result = api.status(args.store)
        elif args.command == "merge":
            result = api.merge(args.a, args.b, args.out)
        else:  # pragma: no cover - argparse rejects unknown commands
            parser.error(f"unknown command {args.command}")
    except (ConfigError, StoreError, NetworkFileError, SourceDataError, OSError, ValueError) as err:
        if getattr(args, "json", False):
            print(json.dumps({"error": str(err), "kind": type(err).__name__}))
        print(f"relulearn: error: {err}", file=sys.stderr)
        return EXIT_USER_ERROR
    except KeyboardInterrupt:
        print("relulearn: interrupted; every merged block was committed. Run the same command to resume.",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    try:
        _print(result, args.json)
        sys.stdout.flush()
    except BrokenPipeError:  # e.g. `relulearn status run.zarr | head -3`
        import os

        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
