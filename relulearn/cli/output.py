"""What the command line prints for people: short tables and summaries (``--json`` prints the data itself)."""

from __future__ import annotations

import json
import math
from typing import Any

from ..storage.errors import RESTORE_HINT


def print_demo(result: dict[str, Any]) -> None:
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


def print_shadow(r: dict[str, Any]) -> None:
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


def print_examples(listed: dict[str, str]) -> None:
    """The shipped examples, one a line, and how to write one to a file."""
    width = max(len(name) for name in listed)
    for name, description in listed.items():
        print(f"{name:<{width}}  {description}")
    print("(`relulearn example NAME > NAME.yaml` writes one; its comment says what to run)")


def print_status(st: dict[str, Any]) -> None:
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
            print(f"locked       by a lease whose holder is unknown: {lease['stale']} (--break-lock takes it)")
        else:
            who = f"process {lease['pid']}" + (f" ({lease['command']})" if lease.get("command") else "")
            print(
                f"locked       by {who} on {lease['host']}, since {lease['started']}, last heartbeat "
                f"{lease['heartbeat']}"
            )
            if lease["stale"]:
                then = "takes it over" if lease.get("holder_gone") else "needs --break-lock"
                print(f"             stale: {lease['stale']} (the next writer {then})")
    print("(the fingerprint and the rest: --json)")


def print_verify(r: dict[str, Any], verbose: bool = False) -> None:
    """What `relulearn verify` found: for an intact store a summary line (with ``verbose``, the table below
    first); for a damaged one the table, one row per array (chunks checked, status) and the metadata."""

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
    if verbose or not r["intact"]:  # an intact store's rows all say ok: -v (or --json) lists them
        width = max(len(a) for a, _, _ in table + [("array", "", "")])
        print(f"{'array':<{width}}  {'chunks':>6}  status")
        for array, chunks, state in table:
            print(f"{array:<{width}}  {chunks:>6}  {state}")
    if r.get("found"):
        print(f"found: {r['found'].removeprefix('it holds ')} (not checked: the manifest was in the root metadata)")
    damaged = r["damaged"] + [d for p in r["passes"] for d in p["damaged"]]
    if r["intact"]:
        passes = f" (and {len(r['passes'])} pass store(s) under it)" if r["passes"] else ""
        print(
            f"intact: {sum(a['chunks'] for a in r['arrays'])} chunks of {len(r['arrays'])} arrays and "
            f"{r['documents']} metadata documents checked in {r['seconds']:.2f} s{passes}"
            + ("" if verbose else "; each array: -v or --json")
        )
    else:
        arrays = {d["array"] for d in damaged}
        print(f"DAMAGED: {len(damaged)} damaged object(s) in {len(arrays)} array(s) or document(s); {RESTORE_HINT}")
    if r.get("unfinished"):
        print(
            f"unfinished record writes (a writer killed while writing; readers ignore them, safe to delete): "
            f"{', '.join(r['unfinished'])}"
        )


def _format(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.3e}" if v != 0 and (abs(v) < 1e-2 or abs(v) >= 1e6) else f"{v:,.3f}"
    if isinstance(v, int) and not isinstance(v, bool):
        return f"{v:,}"
    if isinstance(v, list) and len(v) <= 12 and all(isinstance(e, (int, float)) for e in v):
        return "[" + ", ".join(_format(e) for e in v) + "]"
    return str(v)


def print_result(result: dict[str, Any], as_json: bool) -> None:
    """JSON, or a short table for people: scalar fields and short lists; the lines of a
    method's ``report["summary"]``; nested parts only named (they are in ``--json``)."""
    if as_json:
        print(json.dumps(result, indent=2, default=str))
        return

    def short(v: Any) -> bool:  # a scalar, or a short list of numbers
        return not isinstance(v, (dict, list)) or (
            isinstance(v, list) and 0 < len(v) <= 12 and all(isinstance(e, (int, float)) for e in v)
        )

    # the dashboard's address was printed when the cluster started; the cluster is gone by now
    rows = [(k, _format(v)) for k, v in result.items() if short(v) and k not in ("passes", "dashboard")]
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


def print_curve(r: dict[str, Any]) -> None:
    """The table of `relulearn curve`: per sample count the errors and seconds, then the slope and exact recovery."""

    def num(v: Any) -> str:
        return "—" if v is None else f"{v:.3e}"

    print(f"learning curve of {r['method']} on {r['store']}")
    print(f"{'samples':>12}  {'parameter error':>15}  {'test error':>10}  {'seconds':>8}")
    for p in r["points"]:
        note = "  (recorded)" if p["reused"] else ""
        if p.get("error"):
            note += f"  nothing learned: {p['error'].split(';')[0]}"
        print(
            f"{p['samples']:>12,}  {num(p['parameter_error']):>15}  {num(p['relative_test_error']):>10}  "
            f"{p['seconds']:>8.1f}{note}"
        )
    fit = r["fit"]
    if fit["slope"] is None:
        print(
            f"slope: not fitted ({len(fit['fitted'])} point(s) with a parameter error above the exact floor "
            f"{fit['floor']:g}; two needed)"
        )
    else:
        se = "" if fit["slope_se"] is None else f" ± {fit['slope_se']:.2f}"
        print(
            f"slope of the parameter error: {fit['slope']:.3f}{se} over {len(fit['fitted'])} points "
            f"(the papers' rate under label noise: {r['stated_slope']:g})"
        )
    if r["exact_recovery_samples"] is not None:
        print(
            f"exact recovery from {r['exact_recovery_samples']:,} samples (parameter error below {fit['floor']:g}; "
            "left out of the slope)"
        )
    print(
        f"this run: {r['learned']} new point(s), {r['blocks_run']} block(s) estimated, {r['seconds']:.1f} s; "
        f"the store holds {r['store_samples']:,} samples"
    )
    if r.get("plot"):
        print(f"plot: {r['plot']}")
