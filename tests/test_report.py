"""`relulearn report`: one self-contained HTML file, rendered in headless Chromium and its screenshot checked."""

from __future__ import annotations

import os
import re
import shutil
import subprocess

import numpy as np
import pytest
import yaml

from relulearn import api
from relulearn.config import config_from_dict
from relulearn.report import FIGURES, FRAME_COLOURS

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
    """A store extended twice (three learns), a model and its teacher: the report draws all five figures; in
    the screenshot each figure's frame is found by its colour, and inside it a drawn plot (not a blank)."""
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
    assert_figures_on_screenshot(screenshot(out, tmp_path / "shot.png"), [name for name, _ in FIGURES])


def assert_figures_on_screenshot(img: np.ndarray, names: list[str]) -> None:
    """Each figure's frame is found by its colour on the screenshot, and inside it a drawn plot (not a blank, not
    a solid block)."""
    for name in names:
        rgb = np.array([int(FRAME_COLOURS[name][i : i + 2], 16) for i in (1, 3, 5)])
        ys, xs = np.nonzero(np.all(np.abs(img - rgb) <= 2, axis=2))
        assert len(ys) > 2000, f"the frame of figure {name} is not on the screenshot"
        inner = img[ys.min() + 12 : ys.max() - 12, xs.min() + 12 : xs.max() - 12]
        drawn = np.mean(np.any(inner < 200, axis=2))  # axes, ticks, points and lines
        assert 0.01 < drawn < 0.6, (name, drawn)


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
    assert_figures_on_screenshot(screenshot(out, tmp_path / "shot.png", height=700 * len(expected) + 600), expected)


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
