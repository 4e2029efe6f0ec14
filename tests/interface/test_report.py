"""`relulearn report`: one self-contained HTML file, rendered in headless Chromium and its screenshot checked;
every figure's panels checked on its pixels, and the units figure on the values it draws."""

from __future__ import annotations

import base64
import io
import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.network import Network
from relulearn.report import FIGURES

from conftest import relulearn

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def screenshot(html, png, width: int = 1200, height: int = 2600) -> np.ndarray:
    """The page rendered by headless Chromium (flags for a closed network), as an RGB array."""
    from PIL import Image

    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("no Chromium: .ci/run installs Debian's chromium (apt-get install chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    done = subprocess.run(
        [
            CHROMIUM,
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            f"--user-data-dir={png.parent / 'chromium'}",
            "--hide-scrollbars",
            f"--window-size={width},{height}",
            f"--screenshot={png}",
            f"file://{html}",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert png.exists(), done.stderr
    return np.asarray(Image.open(png).convert("RGB")).astype(int)


@pytest.mark.extra("report")
def test_the_report_shows_every_figure(tmp_path):
    """A store extended twice (three learns), a model and its teacher: the report draws all five figures, each
    panel of each with data in it, and each figure is on the screenshot pixel for pixel."""
    cfg = {
        "seed": 2,
        "samples": 100_000,
        "chunk_size": 25_000,
        "source": {"d": 12, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.05},
        "statistics": {
            "basic": {},
            "contracted": {"orders": [2, 4], "directions": 4},
            "filtered": {"quantiles": [0.3, 0.6, 0.9]},
        },
    }
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    store, model = str(tmp_path / "s.zarr"), str(tmp_path / "m.npz")
    for n in (100_000, 200_000, 400_000):
        api.fit(config_from_dict(cfg), store, "moments", width=3, samples=n, out=model, client="local", progress=None)
    out = tmp_path / "report.html"
    done = relulearn("report", store, "--model", model, "--teacher", str(tmp_path / "c.yaml"), "--out", str(out))
    assert done.returncode == 0, done.stderr
    assert "figures spectra, tau, learning, units, samples" in done.stdout and "not drawn" not in done.stdout
    assert "overlapping text" not in done.stdout
    page = out.read_text()
    assert len(re.findall(r"src='data:image/png;base64,", page)) == len(FIGURES)
    assert not re.search(r"(src|href)=['\"](?!data:)", page)  # self-contained: nothing fetched
    figures = embedded(page)
    assert list(figures) == [name for name, _ in FIGURES]
    for name, rgb in figures.items():
        assert_panels_drawn(name, rgb)
    assert_figures_on_screenshot(screenshot(out, tmp_path / "shot.png"), figures)


def embedded(page: str) -> dict[str, np.ndarray]:
    """The figures of a report page by their ``<figure>`` ids, each its embedded PNG as an RGB array."""
    from PIL import Image

    found = re.findall(r"<figure id='([\w-]+)'><img alt='[^']*' src='data:image/png;base64,([^']+)'", page)
    return {name: np.asarray(Image.open(io.BytesIO(base64.b64decode(data))).convert("RGB")) for name, data in found}


def assert_figures_on_screenshot(img: np.ndarray, figures: dict[str, np.ndarray]) -> None:
    """Each figure is on the screenshot whole and pixel for pixel as embedded (Chromium drew it at its size and
    nothing covers it): found by its most varied row, then compared entire."""
    shot = img.astype(np.uint8)
    rows = [shot[y].tobytes() for y in range(len(shot))]
    for name, fig in figures.items():
        h, w, _ = fig.shape
        r = int(np.argmax([len(np.unique(row, axis=0)) for row in fig]))
        needle, places = fig[r].tobytes(), []
        for y, row in enumerate(rows):
            i = row.find(needle)
            while i >= 0:
                if i % 3 == 0 and 0 <= y - r and y - r + h <= len(shot):
                    places.append((y - r, i // 3))
                i = row.find(needle, i + 1)
        whole = [(y, x) for y, x in places if np.array_equal(shot[y : y + h, x : x + w], fig)]
        assert len(whole) == 1, f"figure {name} is not on the screenshot as embedded ({len(places)} row matches)"


def axes_boxes(rgb: np.ndarray) -> list[tuple[int, int, int, int]]:
    """The (top, bottom, left, right) pixel rows and columns of the spines of every axes drawn in a figure: the
    dark connected shapes at least 60 px each way that have two rows and two columns of dark pixels most of
    their width and height long (a colour bar's box is narrower)."""
    from scipy import ndimage

    dark = rgb.max(axis=2) < 110
    labels, _ = ndimage.label(dark)
    boxes = []
    for index, (ys, xs) in enumerate(ndimage.find_objects(labels), start=1):
        h, w = ys.stop - ys.start, xs.stop - xs.start
        if h < 60 or w < 60:
            continue
        part = labels[ys, xs] == index
        rows, cols = np.nonzero(part.sum(1) > 0.8 * w)[0], np.nonzero(part.sum(0) > 0.8 * h)[0]
        if len(rows) >= 2 and len(cols) >= 2:
            boxes.append((ys.start + rows[0], ys.start + rows[-1], xs.start + cols[0], xs.start + cols[-1]))
    return sorted(boxes, key=lambda b: (b[0] // 50, b[2]))


def inside(rgb: np.ndarray, box: tuple[int, int, int, int]) -> np.ndarray:
    top, bottom, left, right = box
    return rgb[top + 2 : bottom - 1, left + 2 : right - 1].astype(int)


def coloured(rgb: np.ndarray) -> np.ndarray:
    """Where the pixels have a colour (the data's: matplotlib's cycle), not a grey of the frame, text or guides."""
    return (rgb.max(axis=2) - rgb.min(axis=2)) > 40


def assert_panels_drawn(name: str, rgb: np.ndarray, panels: int | None = None) -> None:
    """Every axes of a figure's PNG has data drawn inside its spines (at least 30 coloured pixels: a blank
    panel, or one with only a grey guide line, has none)."""
    boxes = axes_boxes(rgb)
    assert boxes and (panels is None or len(boxes) == panels), (name, boxes)
    for box in boxes:
        assert np.count_nonzero(coloured(inside(rgb, box))) >= 30, f"a panel of figure {name} is empty: {box}"


def _landscape_config() -> dict:
    return {
        "seed": 3,
        "samples": 600_000,
        "chunk_size": 50_000,
        "source": {
            "d": 6,
            "noise_std": 0.0,
            "teacher": {
                "kind": "one_hidden_relu",
                "width": 6,
                "weights": np.eye(6).tolist(),
                "output_weights": [1.2, 0.7, 1.0, 0.6, 1.4, 0.9],
            },
        },
    }


#: a small store of each method (the moments method's report is tested above), the method's options, and the
#: figures its report must draw (the common ones its store and learn allow, and the method's own)
METHOD_STORES = {
    "polynomial": (
        {
            "seed": 4,
            "samples": 300_000,
            "chunk_size": 50_000,
            "source": {"d": 6, "teacher": {"kind": "random_xavier", "widths": [32], "seed": 1}},
        },
        {},
        ["spectra", "degree", "samples"],
    ),
    "landscape": (
        _landscape_config(),
        {"width": 6},
        ["spectra", "objective", "angles", "learning", "units", "samples"],
    ),
    "exact": (
        {
            "seed": 1,
            "samples": 200_000,
            "chunk_size": 50_000,
            "source": {
                "d": 10,
                "teacher": {"kind": "two_layer", "width": 3, "outputs": 3, "activation": "relu2", "weights_seed": 0},
            },
        },
        {},
        ["spectra", "decomposition", "outputs", "learning", "units", "samples"],
    ),
    "filtered-pca": (
        {
            "seed": 2,
            "samples": 400_000,
            "chunk_size": 50_000,
            "source": {"d": 10, "teacher": {"kind": "deep_relu", "widths": [2, 3], "seed": 2}},
        },
        {"depth": 2, "width": 3, "refine_samples": 0},
        ["spectra", "tau", "filtered", "passes", "samples"],
    ),
}


@pytest.mark.extra("report")
@pytest.mark.parametrize("method", sorted(METHOD_STORES))
def test_every_method_has_its_figures_with_no_text_over_text(tmp_path, method):
    """A store learned by each method: its report draws the method's own figures beside the common ones (at
    least three in all), no two texts of a figure overlap, and each figure is on the page Chromium renders."""
    from relulearn.report import write_report

    cfg, options, expected = METHOD_STORES[method]
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    store, model = str(tmp_path / "s.zarr"), str(tmp_path / "m.npz")
    api.fit(config_from_dict(cfg), store, method, out=model, client="local", progress=None, **options)
    out = tmp_path / "report.html"
    got = write_report(store, out, model=model, teacher=str(tmp_path / "c.yaml"))
    assert got["figures"] == expected and len(expected) >= 3, got["not_drawn"]
    assert got["overlaps"] == {}
    figures = embedded(out.read_text())
    for name, rgb in figures.items():
        assert_panels_drawn(name, rgb)
    assert_figures_on_screenshot(screenshot(out, tmp_path / "shot.png", height=700 * len(expected) + 600), figures)


@pytest.mark.extra("report")
def test_overlapping_texts_are_found_and_the_panels_have_none():
    """The overlap check sees a y-label drawn over the neighbouring panel's tick labels (matplotlib's default
    layout, squeezed), and none in the report's own panels of the same size."""
    from relulearn.report._plot import drawn, panels, plt

    def draw(fig, axes):
        for ax in axes:
            ax.plot([1e3, 2e3], [1e5, 3e5])
            ax.set_ylabel("a long label of the values on this axis")
            ax.set_xlabel("the index of the value")
        return drawn(fig)[1]

    squeezed = plt().subplots(1, 4, figsize=(6, 2.4))
    assert draw(squeezed[0], squeezed[1])
    fig, axes = panels(4, width=3.6, height=3.0)
    assert draw(fig, axes) == ()


@pytest.mark.extra("report")
def test_a_report_of_a_bare_store_says_what_would_draw_each_missing_figure(tmp_path):
    cfg = {
        "seed": 1,
        "samples": 50_000,
        "chunk_size": 25_000,
        "source": {"d": 6},
        "statistics": {"basic": {}, "contracted": {"orders": [2], "directions": 2}},
    }
    api.estimate(config_from_dict(cfg), str(tmp_path / "s.zarr"), client="local", progress=None)
    from relulearn.report import write_report

    got = write_report(str(tmp_path / "s.zarr"), tmp_path / "r.html")
    assert got["figures"] == ["spectra"]
    assert set(got["not_drawn"]) == {"tau", "learning", "units", "samples"}
    assert "statistics.filtered" in got["not_drawn"]["tau"] and "--model and --teacher" in got["not_drawn"]["units"]


def planted(seed: int, d: int, k: int, m: int) -> Network:
    """A random one-hidden-layer ReLU network with biases: unit-scale rows, offsets of order one, signed output
    weights on m outputs, output biases."""
    rng = np.random.default_rng(seed)
    u = rng.standard_normal((k, d)) / np.sqrt(d)
    a = rng.choice([-1.0, 1.0], (m, k)) * rng.uniform(0.5, 1.5, (m, k))
    return Network((u, a), (0.6 * rng.standard_normal(k), rng.standard_normal(m)))


#: the statistics of the biased stores: the methods' own and the filtered and Hermite families, so that every
#: common figure has its inputs (a label vector's families are stored per output)
BIASED_STATISTICS = {
    "basic": {},
    "contracted": {"orders": [2, 4], "directions": 8, "control": True},
    "filtered": {"quantiles": [0.3, 0.6, 0.9]},
    "hermite": {"max_order": 2},
}

#: method, teacher (a network file, or a configuration's teacher), statistics, the figures the report draws
UNIT_REPORTS = {
    "tensor": (planted(7, 8, 4, 2), BIASED_STATISTICS, ["spectra", "tau", "learning", "units", "samples"]),
    "moments": (planted(11, 8, 3, 1), BIASED_STATISTICS, ["spectra", "tau", "learning", "units", "samples"]),
    "exact": (
        {"kind": "two_layer", "width": 3, "outputs": 3, "activation": "relu2", "weights_seed": 0},
        None,
        ["spectra", "decomposition", "outputs", "learning", "units", "samples"],
    ),
}


def bar_count(rgb: np.ndarray, box: tuple[int, int, int, int]) -> int:
    """The bars standing on the bottom of a panel: runs of columns with colour in its lowest quarter (a log bar
    reaches at least a third of the way up; the legend sits at the top)."""
    panel = coloured(inside(rgb, box))
    columns = panel[-len(panel) // 4 :].any(axis=0).astype(int)
    return int(np.count_nonzero(np.diff(np.r_[0, columns]) == 1))


def assert_on_the_diagonal(rgb: np.ndarray, box: tuple[int, int, int, int], points: int) -> None:
    """A scatter of learned against teacher values whose x and y ranges are the same: ``points`` separate marks,
    every coloured pixel on the diagonal (to a mark's radius)."""
    from scipy import ndimage

    panel = coloured(inside(rgb, box))
    assert ndimage.label(panel)[1] == points
    ys, xs = np.nonzero(panel)
    h, w = panel.shape
    assert np.max(np.abs(xs / w - (h - ys) / h)) <= 0.03


@pytest.mark.slow
@pytest.mark.extra("report")
@pytest.mark.parametrize("method", sorted(UNIT_REPORTS))
def test_units_with_biases_and_several_outputs_are_matched_and_every_figure_drawn(tmp_path, method):
    """A tensor model (biases, two outputs), a moments model with biases and an exact model (relu², three
    outputs), each learned exactly from its teacher: the report draws every figure it lists with data in every
    panel; the units figure pairs each teacher unit with a learned unit at angle ≈ 0 and the teacher's output
    weights, offsets and output biases, draws one bar per teacher unit, and puts every pair on the diagonal."""
    from relulearn.report import write_report
    from relulearn.report.units import pairs

    teacher, statistics, expected = UNIT_REPORTS[method]
    if isinstance(teacher, Network):
        teacher.save(tmp_path / "t.npz")
        source = {"d": 8, "teacher": {"file": str(tmp_path / "t.npz")}}
    else:
        source = {"d": 10, "teacher": teacher}
    cfg = {"seed": 2, "samples": 200_000, "chunk_size": 50_000, "source": source}
    if statistics is not None:
        cfg["statistics"] = statistics
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    store, model = str(tmp_path / "s.zarr"), str(tmp_path / "m.npz")
    api.fit(config_from_dict(cfg), store, method, out=model, client="local", progress=None)
    out = tmp_path / "report.html"
    got = write_report(store, out, model=model, teacher=str(tmp_path / "c.yaml"))
    assert got["figures"] == expected, got["not_drawn"]
    assert got["overlaps"] == {}
    figures = embedded(out.read_text())
    assert list(figures) == expected
    for name, rgb in figures.items():
        assert_panels_drawn(name, rgb)

    from relulearn.config import load_config
    from relulearn.pipeline.sources import make_source

    t_net = make_source(load_config(str(tmp_path / "c.yaml"))).network
    p = pairs(t_net, Network.load(model))
    k, m = t_net.weights[1].T.shape
    assert sorted(p.matching) == list(range(k))  # every teacher unit matched, each with a learned unit of its own
    assert np.all(p.angles <= 1e-10)
    scale = np.max(np.abs(p.teacher_weights))
    assert np.max(np.abs(p.learned_weights - p.teacher_weights)) <= 1e-10 * scale
    biased = t_net.biases is not None
    assert (p.teacher_offsets is not None) is biased
    if biased:
        assert np.max(np.abs(p.learned_offsets - t_net.biases[0] / np.linalg.norm(t_net.weights[0], axis=1))) <= 1e-10
        assert np.max(np.abs(p.learned_output_bias - t_net.biases[1])) <= 1e-10
    units = figures["units"]
    boxes = axes_boxes(units)
    assert len(boxes) == (3 if biased else 2)
    assert bar_count(units, boxes[0]) == k
    if biased:  # the offsets: one mark per unit (the middle panel has a legend)
        assert_on_the_diagonal(units, boxes[2], k)
    else:  # the output weights: one mark per unit and output
        assert_on_the_diagonal(units, boxes[1], k * m)
