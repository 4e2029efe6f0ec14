"""The commands: each turns parsed arguments into a call of :mod:`relulearn.api` and returns what to print, or
the exit code when it printed itself. Importing this module imports the library (numpy, zarr, dask, the methods):
the command line does so only once the arguments are read and a locked store has been refused."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import Any

from .. import api
from ..atomic import is_remote, local_path, write_text
from ..config import ConfigError
from ..methods import OPTIONS
from .codes import EXIT_DAMAGED
from .output import print_curve, print_demo, print_examples, print_result, print_shadow, print_status, print_verify

log = logging.getLogger(__name__)


#: a run projected at least this long says so as it starts, and how to stop and resume it
LONG_RUN_SECONDS = 60.0


def _check_file_path(flag: str, path: str | None, example: str) -> None:
    """Refuse, before a long run, an output file path whose folder does not exist or that is a folder (a local
    path or ``file://`` URL), or a URL whose protocol has no file system installed."""
    if path is None:
        return
    if is_remote(path):
        import fsspec

        protocol = path.split("://", 1)[0]
        try:
            fsspec.get_filesystem_class(protocol)
        except (ImportError, ValueError) as err:
            raise ValueError(f"{flag} {path}: {protocol}:// cannot be written here ({err})") from None
        return
    p = local_path(path)
    if p.is_dir():
        raise ValueError(f"{flag} {path} is a folder; give a file path, e.g. {p / example}")
    if not p.parent.is_dir():
        raise ValueError(f"{flag} {path}: the folder {p.parent} does not exist; create it or choose another path")


#: commands whose ``--out`` is a file (a path or a URL) written when the work is done, and an example file name
_FILE_OUT = {
    "learn": "model.npz",
    "fit": "model.npz",
    "exact-arbitrary": "model.npz",
    "predict": "predictions.npy",
    "report": "report.html",
}


def _curve_store(args: argparse.Namespace) -> str:
    """The curve's store: ``--store``, or the configuration's name with the method, in the current folder."""
    return args.store or f"{Path(args.config).stem}-{args.method}-curve.zarr"


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
    if args.command == "curve":
        _check_file_path("--out-json", args.out_json, "curve.json")
        _check_file_path("--plot", args.plot, "curve.png")


def _write_report(path: str, result: dict[str, Any]) -> None:
    write_text(path, json.dumps(result, indent=2, default=str) + "\n")


def _cluster_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {
        "workers": args.workers,
        "scheduler": args.scheduler,
        "client": "local" if args.in_process else None,
        "progress": None if args.quiet else sys.stderr,
        "dashboard": args.dashboard,
    }


def _method_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    return {name: getattr(args, name) for name in OPTIONS}


def _cmd_estimate(args: argparse.Namespace) -> dict[str, Any]:
    def on_start(info: dict) -> None:
        if info.get("set_aside"):  # a notice, not progress: a warning (-q silences it)
            moved = info["set_aside"]
            log.warning(
                "set aside the damaged store's data (%s) in %s; nothing was deleted",
                ", ".join(moved["moved"]),
                moved["folder"],
            )
        if args.quiet:
            return
        if info["dashboard"]:
            print(f"dashboard: {info['dashboard']}", file=sys.stderr)
        if not info["blocks"]:
            print(f"{info['store']} already holds {info['resumed_from_samples']:,} samples: nothing to estimate",
                  file=sys.stderr)  # fmt: skip
            return
        verb = "resuming" if info["resumed_from_samples"] else "starting"
        line = (
            f"{verb} run in {info['store']}: {info['resumed_from_samples']:,} -> {info['target_samples']:,} "
            f"samples in {info['blocks']:,} block{'' if info['blocks'] == 1 else 's'}"
        )
        projected = info.get("projected_seconds")
        if projected is not None and projected >= LONG_RUN_SECONDS:  # a long run: say so, and how to stop it
            from ..pipeline.projection import format_seconds

            line += (
                f"; projected {format_seconds(projected)}: stop at any moment with Ctrl-C and resume with the same "
                "command"
            )
        print(line, file=sys.stderr)

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
        dashboard=args.dashboard,
        new_store_here=args.new_store_here,
    )
    return summary.to_dict()


# ------------------------------------------------------------------ the commands


def _status(args: argparse.Namespace) -> dict[str, Any] | int:
    result = api.status(args.store)
    if args.json:
        return result
    print_status(result)
    return 0


def _verify(args: argparse.Namespace) -> int:
    result = api.verify(args.store)
    if args.json:
        print(json.dumps(result, indent=2))
    else:
        print_verify(result, verbose=args.verbose > 0)
    sys.stdout.flush()
    return 0 if result["intact"] else EXIT_DAMAGED


def _report(args: argparse.Namespace) -> dict[str, Any] | int:
    from ..report import plt, write_report

    plt()  # matplotlib installed, before the store is read
    result = write_report(args.store, args.out, model=args.model, teacher=args.teacher)
    if args.json:
        return result
    print(f"wrote {result['out']} ({result['bytes'] / 1e3:.0f} kB): figures {', '.join(result['figures']) or 'none'}")
    for name, why in result["not_drawn"].items():
        print(f"  not drawn: {name}: {why}")
    for name, pairs in result["overlaps"].items():
        print(f"  overlapping text in {name}: {'; '.join(pairs[:3])}")
    return 0


def _learn(args: argparse.Namespace) -> dict[str, Any]:
    return api.learn(
        args.store,
        args.method,
        out=args.out,
        break_lock=args.break_lock,
        **_method_kwargs(args),
        **_cluster_kwargs(args),
    )


def _fit(args: argparse.Namespace) -> dict[str, Any] | int:
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
    if not args.dry_run:
        return result
    print(json.dumps(result["plan"], indent=2) if args.json else "\n".join(result["plan_lines"]))
    return 0


def _curve(args: argparse.Namespace) -> dict[str, Any] | int:
    if args.plot:
        from ..report import plt

        plt("relulearn curve --plot")  # matplotlib installed, before any work
    result = api.curve(
        args.config,
        _curve_store(args),
        args.method,
        samples=args.samples,
        test_samples=args.test_samples,
        break_lock=args.break_lock,
        **_method_kwargs(args),
        **_cluster_kwargs(args),
    )
    result["plot"] = None
    if args.plot:
        from ..report.curve import write_curve_png

        write_curve_png(result, args.plot)
        result["plot"] = args.plot
    if args.out_json:
        _write_report(args.out_json, result)
    if args.json:
        return result
    print_curve(result)
    return 0


def _plan(args: argparse.Namespace) -> int:
    if args.method is None and args.width is not None:  # estimate's plan has no width: it was silently ignored
        raise ValueError("--width is an option of a method's plan: add --method M (relulearn plan CONFIG --method M)")
    result = api.plan(args.config, args.method, samples=args.samples, width=args.width, workers=args.workers)
    if args.json:
        print(json.dumps({k: v for k, v in result.items() if k != "lines"}, indent=2))
    else:
        print("\n".join(result["lines"]))
    return 0


def _shadow(args: argparse.Namespace) -> dict[str, Any] | int:
    result = api.shadow(args.teacher, args.degree, samples=args.samples, seed=args.seed)
    if args.json:
        return result
    print_shadow(result)
    return 0


def _example(args: argparse.Namespace) -> dict[str, Any] | int:
    # the shipped configurations: read with the configuration package, no cluster or store involved
    from ..config.examples import example_description, example_names, example_text

    if args.name is not None:
        text = example_text(args.name)
        if args.json:
            return {"name": args.name, "text": text}
        sys.stdout.write(text)  # exactly the file, so that `> NAME.yaml` writes the shipped bytes
        return 0
    listed = {name: example_description(name) for name in example_names()}
    if args.json:
        return {"examples": listed}
    print_examples(listed)
    return 0


#: each command's handler: what to print (a dict), or the exit code once it has printed
COMMANDS: dict[str, Any] = {
    "estimate": _cmd_estimate,
    "status": _status,
    "verify": _verify,
    "report": _report,
    "merge": lambda a: api.merge(a.a, a.b, a.out, break_lock=a.break_lock),
    "learn": _learn,
    "fit": _fit,
    "curve": _curve,
    "plan": _plan,
    "exact-arbitrary": lambda a: api.exact_arbitrary(a.inputs, a.labels, a.width, activation=a.activation, out=a.out),
    "predict": lambda a: api.predict(a.model, a.input, a.out),
    "evaluate": lambda a: api.evaluate(a.model, a.teacher, samples=a.samples),
    "shadow": _shadow,
    "demo": lambda a: api.demo(d=a.d, width=a.width, samples=a.samples, seed=a.seed, **_cluster_kwargs(a)),
    "example": _example,
}


def run(args: argparse.Namespace) -> dict[str, Any] | int:
    """Run the command ``args`` names, after checking every file it will write; with ``--report``, also write its
    result there."""
    _check_output_paths(args)
    outcome = COMMANDS[args.command](args)
    if isinstance(outcome, dict) and getattr(args, "report", None):
        _write_report(args.report, outcome)
    return outcome


def show(args: argparse.Namespace, result: dict[str, Any]) -> None:
    """Print a command's result: for people (a summary or a short table), or as JSON with ``--json``."""
    from ..summary import summary_lines

    if args.command in ("learn", "fit") and not args.json:
        print("\n".join(summary_lines(result)))
    elif args.command == "demo" and not args.json:
        print_demo(result)
    else:
        print_result(result, args.json)
