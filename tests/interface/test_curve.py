"""`relulearn curve`: one store extended through sample counts, the method learned at each, the parameter error's
slope on log-log axes (n^{-1/2} under label noise), the exact-recovery point of a noiseless teacher, the plot, and
resuming from the points recorded in the store."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
import yaml

from relulearn.api.curves import EXACT_FLOOR, STATED_SLOPE, fit_slope, rounded_counts
from relulearn.storage import RunStore

from conftest import PYTHON, cli_env, relulearn

#: the noisy teacher's curve: 2.1 decades, doubling (seeds 1-8 gave slopes -0.505 on average, standard deviation
#: 0.078, 6 of 8 within 0.1 of -1/2; seed 1, the configuration's, gives -0.462)
NOISY_COUNTS = "5e4,1e5,2e5,4e5,8e5,1.6e6,3.2e6,6.4e6"


def _config(tmp_path: Path, name: str, *, d: int, weights: list[float], noise: float, chunk: int) -> Path:
    path = tmp_path / f"{name}.yaml"
    cfg = {
        "seed": 1,
        "samples": chunk * 2,
        "chunk_size": chunk,
        "source": {
            "d": d,
            "teacher": {"kind": "one_hidden_relu", "width": len(weights), "output_weights": weights},
            "noise_std": noise,
        },
        "run": {"commit_interval": 0},
    }
    path.write_text(yaml.safe_dump(cfg))
    return path


def _pixel(png_path: Path, fig, ax, x: float, y: float) -> np.ndarray:
    """The RGB of the PNG's pixel where the axes draw the data point (x, y)."""
    import matplotlib.image

    img = matplotlib.image.imread(png_path)
    px, py = ax.transData.transform((x, y))
    scale = img.shape[1] / fig.bbox.width  # the figure's display units at the PNG's resolution
    return img[int(round(img.shape[0] - py * scale)), int(round(px * scale)), :3]


def _rgb(colour: str) -> np.ndarray:
    return np.array([int(colour[i : i + 2], 16) / 255 for i in (1, 3, 5)])


def _lines(ax) -> dict[str, object]:
    return {line.get_label(): line for line in ax.get_lines()}


# ------------------------------------------------------------------ the slope, pure


def test_the_slope_of_exact_power_law_errors_is_their_exponent():
    """error = c n^{-1/2} exactly: slope -1/2 and constant c to rounding, no residual; points below the exact
    floor are the exact-recovery point and left out, as are points not measured."""
    n = [1e5, 3e5, 1e6, 3e6, 1e7]
    got = fit_slope(n, [0.7 * v**-0.5 for v in n])
    assert abs(got["slope"] - STATED_SLOPE) < 1e-12
    assert abs(got["constant"] / 0.7 - 1) < 1e-10
    assert got["slope_se"] < 1e-12
    assert got["fitted"] == [int(v) for v in n] and got["exact_recovery_samples"] is None

    errors = [2.0 * v**-1.0 for v in n[:3]] + [1e-16, 3e-11]
    got = fit_slope(n, errors)
    assert abs(got["slope"] + 1.0) < 1e-12 and got["fitted"] == [100_000, 300_000, 1_000_000]
    assert got["exact_recovery_samples"] == 3_000_000 and got["floor"] == EXACT_FLOOR

    got = fit_slope(n[:3], [1e-3, None, 1e-16])  # one point left: no line
    assert got["slope"] is None and got["slope_se"] is None and got["fitted"] == [100_000]
    assert got["exact_recovery_samples"] == 1_000_000


def test_counts_round_up_to_chunks_and_must_increase():
    assert rounded_counts([100_000, 120_001, 1e6], 50_000) == [100_000, 150_000, 1_000_000]
    with pytest.raises(ValueError, match="must increase: 110,000 then 120,000 .both round up to 150,000"):
        rounded_counts([110_000, 120_000], 50_000)
    with pytest.raises(ValueError, match="at least two chunks; start the curve at 100,000"):
        rounded_counts([50_000, 1e6], 50_000)


def test_decreasing_counts_are_refused_by_the_parser(tmp_path):
    cfg = _config(tmp_path, "c", d=4, weights=[1.0], noise=0.0, chunk=1000)
    done = relulearn("curve", cfg, "--samples", "1e4,5e3", "--store", tmp_path / "s.zarr")
    assert done.returncode == 2 and "sample counts must increase: 10,000 then 5,000" in done.stderr
    assert not (tmp_path / "s.zarr").exists()


def test_a_plot_without_matplotlib_is_refused_before_any_work(tmp_path):
    """Without matplotlib `relulearn curve --plot` names the extra to install, as `relulearn: error:` with exit code
    2, before any store is made (a process of its own: the blocked import is set up by its PYTHONPATH)."""
    blocked = tmp_path / "blocked" / "matplotlib"
    blocked.mkdir(parents=True)
    (blocked / "__init__.py").write_text("raise ImportError('matplotlib is not installed here')\n")
    env = cli_env()
    env["PYTHONPATH"] = str(tmp_path / "blocked") + ":" + env["PYTHONPATH"]
    cfg = _config(tmp_path, "c", d=4, weights=[1.0], noise=0.0, chunk=1000)
    args = ["curve", str(cfg), "--samples", "2e3,4e3", "--store", str(tmp_path / "s.zarr"), "--plot", "c.png"]
    done = subprocess.run([PYTHON, "-m", "relulearn.cli", *args], capture_output=True, text=True, env=env)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.splitlines() == [
        "relulearn: error: relulearn curve --plot draws with matplotlib, which is not installed: "
        "pip install 'relulearn[report]' (or pip install matplotlib)"
    ]
    assert not (tmp_path / "s.zarr").exists()


# ------------------------------------------------------------------ the command


def test_a_noisy_teacher_s_parameter_error_falls_as_one_over_root_n(tmp_path):
    """Label noise σ = 0.5 on a planted width-2 network in d = 8: from 5·10⁴ to 6.4·10⁶ samples the parameter error
    falls with slope -1/2 ± 0.1 on log-log axes (the moments method's streamed refinement is a least-squares fit
    on every sample). The JSON on stdout and in the file agree, the slope is the least-squares fit of the points
    printed, and the PNG is the figure of these points: each drawn where the data put it, in its colour."""
    from relulearn.report._plot import drawn
    from relulearn.report.curve import COLOURS, curve_axes, curve_png

    cfg = _config(tmp_path, "noisy", d=8, weights=[1.0, -0.6], noise=0.5, chunk=25_000)
    store, out, png = tmp_path / "s.zarr", tmp_path / "curve.json", tmp_path / "curve.png"
    done = relulearn(
        "curve", cfg, "--method", "moments", "--samples", NOISY_COUNTS, "--store", store, "--in-process",
        "--out-json", out, "--plot", png, "--quiet", "--json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    assert json.loads(out.read_text()) == result
    counts = [50_000, 100_000, 200_000, 400_000, 800_000, 1_600_000, 3_200_000, 6_400_000]
    assert result["samples"] == counts and [p["samples"] for p in result["points"]] == counts
    errors = [p["parameter_error"] for p in result["points"]]
    assert all(1e-4 < e < 3e-2 for e in errors), errors  # noisy: far above the exact floor
    fit = result["fit"]
    assert fit == fit_slope(counts, errors)
    assert fit["fitted"] == counts and result["exact_recovery_samples"] is None
    assert abs(fit["slope"] - STATED_SLOPE) <= 0.1, fit
    assert result["stated_slope"] == STATED_SLOPE
    # the test error is the noise's: σ² / E[y²] within its sampling error on 200,000 test samples
    for p in result["points"]:
        assert abs(p["relative_test_error"] / p["noise_floor"] - 1) < 0.02, p
    assert result["store_samples"] == counts[-1] and result["learned"] == len(counts)
    assert [r["samples"] for r in RunStore(str(store)).records("curve")] == counts

    # the PNG written is the figure of these numbers, and its pixels show the points where they lie
    assert png.read_bytes() == curve_png(result)
    fig = curve_axes(result)
    _, overlaps = drawn(fig)
    assert overlaps == ()
    left = fig.axes[0]
    lines = _lines(left)
    assert list(lines["parameter error"].get_xdata()) == counts
    assert list(lines["parameter error"].get_ydata()) == errors
    fitted = lines[f"fit: slope {fit['slope']:.2f} ± {fit['slope_se']:.2f}"]
    x = np.asarray(fitted.get_xdata())
    assert np.allclose(fitted.get_ydata(), fit["constant"] * x ** fit["slope"], rtol=1e-12)
    stated = lines["paper's rate: slope -0.5"]
    ratio = np.asarray(stated.get_ydata()) * np.sqrt(np.asarray(stated.get_xdata()))
    assert np.allclose(ratio, ratio[0], rtol=1e-12)  # slope exactly -1/2
    for n, e in zip(counts, errors):
        assert np.abs(_pixel(png, fig, left, n, e) - _rgb(COLOURS["points"])).max() < 0.05, n
    assert "exact recovery" not in " ".join(lines)

    # the table people read: one row per count, then the slope
    table = relulearn(
        "curve", cfg, "--method", "moments", "--samples", NOISY_COUNTS, "--store", store, "--in-process", "--quiet"
    )
    assert table.returncode == 0, table.stderr
    rows = table.stdout.splitlines()
    assert rows[1].split() == ["samples", "parameter", "error", "test", "error", "seconds"]
    for row, p in zip(rows[2:10], result["points"]):
        want = [f"{p['samples']:,}", f"{p['parameter_error']:.3e}", f"{p['relative_test_error']:.3e}"]
        assert row.split()[:3] == want
        assert row.endswith("(recorded)")
    assert f"slope of the parameter error: {fit['slope']:.3f} ± {fit['slope_se']:.2f} over 8 points" in rows[10]


def test_a_count_too_small_for_the_method_is_a_point_with_the_reason(tmp_path):
    """Label noise σ = 20 on 2,000 and 4,000 samples: the spectral stage finds no direction above the noise floor.
    Each count is a point without errors that says why, no slope is fitted, and the table says so."""
    cfg = _config(tmp_path, "lost", d=8, weights=[1.0, -0.6], noise=20.0, chunk=1000)
    store = tmp_path / "s.zarr"
    done = relulearn("curve", cfg, "--samples", "2e3,4e3", "--store", store, "--in-process", "--quiet", "--json")
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    for p in result["points"]:
        assert p["parameter_error"] is None and p["relative_test_error"] is None
        assert p["error"].startswith("the spectral stage found no direction above the noise floor")
    assert result["fit"]["slope"] is None and result["fit"]["fitted"] == [] and result["store_samples"] == 4_000
    table = relulearn("curve", cfg, "--samples", "2e3,4e3", "--store", store, "--in-process", "--quiet")
    rows = table.stdout.splitlines()
    assert rows[2].split()[:3] == ["2,000", "—", "—"] and "(recorded)  nothing learned: the spectral" in rows[2]
    assert rows[4].startswith("slope: not fitted (0 point(s) with a parameter error above the exact floor 1e-10")
    assert rows[5].startswith("this run: 0 new point(s), 0 block(s) estimated")


def _noiseless(tmp_path: Path) -> Path:
    # width 4 in d = 10 with a weak fourth unit: 2,000 samples do not resolve it, 5,000 do
    return _config(tmp_path, "exact", d=10, weights=[1.0, -0.8, 0.6, -0.3], noise=0.0, chunk=1000)


def test_a_noiseless_teacher_s_curve_marks_the_exact_recovery_point(tmp_path):
    """Without noise the exact polish takes over: at 2,000 samples a unit is missed (error ~0.5), from 5,000 on the
    parameter error is at rounding. The JSON names 5,000 as the exact-recovery point, the floor is left out of the
    slope (one point above it: no slope), and the plot marks the point with its star where the error lies."""
    from relulearn.report._plot import drawn
    from relulearn.report.curve import COLOURS, curve_axes

    cfg = _noiseless(tmp_path)
    store, png = tmp_path / "s.zarr", tmp_path / "curve.png"
    done = relulearn(
        "curve", cfg, "--samples", "2e3,5e3,1e4", "--store", store, "--in-process", "--plot", png, "--quiet", "--json"
    )
    assert done.returncode == 0, done.stderr
    result = json.loads(done.stdout)
    errors = [p["parameter_error"] for p in result["points"]]
    assert errors[0] > 0.1 and all(e < 1e-15 for e in errors[1:]), errors
    assert all(p["relative_test_error"] < 1e-28 for p in result["points"][1:])
    assert result["exact_recovery_samples"] == 5_000 == result["fit"]["exact_recovery_samples"]
    assert result["fit"]["fitted"] == [2_000] and result["fit"]["slope"] is None
    assert result["plot"] == str(png)

    fig = curve_axes(result)
    _, overlaps = drawn(fig)
    assert overlaps == ()
    left = fig.axes[0]
    star = _lines(left)["exact recovery at 5,000"]
    assert list(star.get_xdata()) == [5_000] and list(star.get_ydata()) == [errors[1]]
    assert np.abs(_pixel(png, fig, left, 5_000, errors[1]) - _rgb(COLOURS["exact"])).max() < 0.05
    floor = _lines(left)["exact floor"]
    assert list(floor.get_ydata()) == [EXACT_FLOOR, EXACT_FLOOR]


def test_the_same_curve_again_reuses_its_points_and_a_longer_one_learns_only_the_new_count(tmp_path, client):
    """On a LocalCluster (the session's, by its scheduler): the same command twice learns and estimates nothing the
    second time (the store keeps its samples, no new learn record) and gives the same numbers bitwise; a count
    added at the end extends the store and learns that count only. A store holding more samples than a count not
    yet learned is refused: a curve only extends its store."""
    cfg = _noiseless(tmp_path)
    store = tmp_path / "s.zarr"
    where = ["--scheduler", client.scheduler.address, "--quiet", "--json"]

    def run(counts: str) -> dict:
        done = relulearn("curve", cfg, "--samples", counts, "--store", store, *where)
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    first = run("2e3,5e3")
    learns = len(RunStore(str(store)).records("learn"))
    assert (first["learned"], first["store_samples"], learns) == (2, 5_000, 2)
    assert first["blocks_run"] > 0 and not any(p["reused"] for p in first["points"])

    again = run("2e3,5e3")
    assert (again["learned"], again["blocks_run"], again["store_samples"]) == (0, 0, 5_000)
    assert len(RunStore(str(store)).records("learn")) == learns
    assert all(p["reused"] for p in again["points"])
    strip = ("reused",)
    assert [{k: v for k, v in p.items() if k not in strip} for p in again["points"]] == [
        {k: v for k, v in p.items() if k not in strip} for p in first["points"]
    ]
    assert again["fit"] == first["fit"] and again["exact_recovery_samples"] == first["exact_recovery_samples"]

    longer = run("2e3,5e3,1e4")
    assert (longer["learned"], longer["store_samples"]) == (1, 10_000)
    assert [p["reused"] for p in longer["points"]] == [True, True, False]
    assert longer["points"][:2] == again["points"]
    assert len(RunStore(str(store)).records("learn")) == learns + 1

    refused = relulearn("curve", cfg, "--samples", "3e3,1e4", "--store", store, *where)
    assert refused.returncode == 2
    assert "holds 10,000 samples, more than 3,000" in refused.stderr and "a new --store" in refused.stderr
