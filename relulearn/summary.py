"""A person's summary of a ``learn`` / ``fit`` result: what was found, how well, what was done, where it went.

Pure formatting of the result dict the API returns (the full report is ``--json`` or ``--report PATH``);
every line is optional, so any method's report gives a summary of what it holds, in at most
:data:`MAX_LINES` lines.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, cast

__all__ = ["summary_lines", "MAX_LINES"]

MAX_LINES = 24
_SHOWN = 6  # numbers of a list shown before "…"


#: an angle bound at or above this many radians says nothing about the subspace found
VACUOUS_BOUND = 1.0


def _num(v: Any) -> str:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return f"{v:.3g}"


def _nums(vs: Sequence[Any]) -> str:
    head = ", ".join(_num(v) for v in list(vs)[:_SHOWN])
    return head + (f", … ({len(vs)} in all)" if len(vs) > _SHOWN else "")


def _model(result: Mapping[str, Any]) -> str:
    kind = result.get("kind", "model")
    rep = result.get("report") or {}
    if kind == "polynomial":
        return f"a polynomial of degree {result.get('degree', '?')}"
    arch = rep.get("architecture")
    if arch:
        return f"a ReLU network with hidden widths {arch}"
    width, depth = result.get("width"), result.get("depth")
    if width is not None and depth == 1:
        return f"a one-hidden-layer network of width {width}"
    if width is not None:
        return f"a network of depth {depth}, first width {width}"
    return f"a {kind}"


def _subspace(rep: Mapping[str, Any]) -> str | None:
    sub = rep.get("subspace")
    if not isinstance(sub, Mapping) or "rank" not in sub:
        return None
    line = f"rank {sub['rank']}" + (f" of d = {len(sub['basis'])}" if sub.get("basis") else "")
    if sub.get("strength"):
        line += f"; strengths {_nums(sub['strength'])}"
        if sub.get("threshold") is not None:
            line += f" (threshold {_num(sub['threshold'])})"
    bound = sub.get("angle_bound")
    if bound is not None:
        # a bound of a radian or more says nothing (the noise reaches the spectral gap): not shown as a number,
        # which next to an exact recovery would read as an error of 1.57 rad
        line += f"; angle bound {_num(bound)} rad" if bound < VACUOUS_BOUND else "; angle bound vacuous (≥ 1 rad)"
    return line


def _units(result: Mapping[str, Any], rep: Mapping[str, Any]) -> str | None:
    units = result.get("units")
    if isinstance(units, Mapping) and units.get("output_weights"):
        line = f"λ‖u‖ = {_nums(units['output_weights'])}"
        if units.get("offsets") is not None:
            line += f"; offsets b/‖u‖ = {_nums(units['offsets'])}; output bias {_num(units['output_bias'])}"
        return line
    enum = rep.get("enumeration")
    if isinstance(enum, Mapping) and enum.get("weights"):
        return f"output weights λ = {_nums(enum['weights'])}"
    return None


def _data(est: Any) -> str | None:
    data = est.get("data") if isinstance(est, Mapping) else None
    if not isinstance(data, Mapping):
        return None
    return f"{data['rows']:,} usable rows, {data['skipped_rows']:,} skipped (NaN/inf), " + (
        "whitened (the model maps raw inputs)" if data.get("whitened") else "not whitened"
    )


def _losses(rep: Mapping[str, Any]) -> str | None:
    val = rep.get("validation_relative_loss")
    if not isinstance(val, Mapping) or not val:
        return None
    line = " → ".join(f"{k} {_num(v)}" for k, v in val.items() if isinstance(v, (int, float)))
    if rep.get("chosen"):
        line += f" (chosen: {rep['chosen']})"
    return line


def _stage(part: Any) -> str | None:
    """One line for a polish or refinement report: skipped, or its passes / iterations and stop."""
    if not isinstance(part, Mapping):
        return None
    if "skipped" in part:
        return f"skipped: {part['skipped']}"
    bits = []
    for key, name in (("passes", "passes"), ("iterations", "iterations")):
        if isinstance(part.get(key), int):
            bits.append(f"{part[key]} {name}")
    if isinstance(part.get("samples"), int):
        bits.append(f"{part['samples']:,} samples")
    for key in ("stop_reason", "stopped", "stop"):
        if part.get(key):
            bits.append(str(part[key]))
            break
    if part.get("relative_residual") is not None:
        bits.append(f"relative residual {_num(part['relative_residual'])}")
    return ", ".join(bits) or None


def summary_lines(result: Mapping[str, Any]) -> list[str]:
    """The lines of a short summary of a ``learn`` or ``fit`` result (at most :data:`MAX_LINES`)."""
    rep = cast(Mapping[str, Any], result.get("report") if isinstance(result.get("report"), Mapping) else {})
    rows: list[tuple[str, str | None]] = []
    where = f" written to {result['out']}" if result.get("out") else " (not written: no --out)"
    head = f"{result.get('method', '?')}: {_model(result)}{where}"
    est = result.get("estimate")
    samples = f"{result['samples']:,}" if isinstance(result.get("samples"), int) else None
    if isinstance(est, Mapping) and samples and not est.get("blocks_run"):
        samples += " (all in the store already)"
    elif isinstance(est, Mapping) and samples:
        samples += f" (this run estimated {est.get('blocks_run', 0):,} blocks in {_num(est.get('seconds', 0))} s" + (
            f", {_num(est['samples_per_second'])} samples/s)" if est.get("samples_per_second") else ")"
        )
    rows.append(("samples", samples))
    rows.append(("input d", _num(result["input_dim"]) if "input_dim" in result else None))
    rows.append(("data", _data(est)))
    rows.append(("subspace", _subspace(rep)))
    rows.append(("units", _units(result, rep)))
    rows.append(("held-out loss", _losses(rep)))
    rows.append(("polish", _stage(rep.get("polish"))))
    rows.append(("refinement", _stage(rep.get("refinement"))))
    if rep.get("stop_reason"):
        rows.append(("stopped", str(rep["stop_reason"])))
    passes = result.get("passes") or []
    rows.append(("passes", ", ".join(p.get("name", "?") for p in passes) if passes else "none"))
    for k, v in (rep.get("summary") or {}).items():  # a method's own summary fields
        if not isinstance(v, (Mapping, list)) or (isinstance(v, list) and len(v) <= _SHOWN):
            rows.append((str(k), _nums(v) if isinstance(v, list) else _num(v)))
    if isinstance(result.get("seconds"), (int, float)):
        rows.append(("time", f"{_num(result['seconds'])} s"))
    rows = [(k, v) for k, v in rows if v]
    width = max(len(k) for k, _ in rows) if rows else 0
    lines = [head] + [f"  {k:<{width}}  {v}" for k, v in rows]
    lines = lines[: MAX_LINES - 1]
    lines.append("(the full report: --json, or --report PATH)")
    return lines
