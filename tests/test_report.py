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

from conftest import PYTHON, cli_env

CHROMIUM = next((p for p in (shutil.which(n) for n in ("chromium", "chromium-browser", "google-chrome")) if p), None)


def screenshot(html, png, width: int = 1200, height: int = 2600) -> np.ndarray:
    """The page rendered by headless Chromium (flags for a closed network), as an RGB array."""
    from PIL import Image

    if CHROMIUM is None:
        if os.environ.get("CI"):
            pytest.fail("no Chromium: .ci/run installs Debian's chromium (apt-get install chromium)")
        pytest.skip("no Chromium on this machine (apt-get install chromium)")
    done = subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                           "--disable-background-networking", "--disable-component-update", "--disable-sync",
                           f"--user-data-dir={png.parent / 'chromium'}", "--hide-scrollbars",
                           f"--window-size={width},{height}", f"--screenshot={png}", f"file://{html}"],
                          capture_output=True, text=True, timeout=120)
    assert png.exists(), done.stderr
    return np.asarray(Image.open(png).convert("RGB")).astype(int)


def test_the_report_shows_every_figure(tmp_path):
    """A store extended twice (three learns), a model and its teacher: the report draws all five figures; in
    the screenshot each figure's frame is found by its colour, and inside it a drawn plot (not a blank)."""
    cfg = {"seed": 2, "samples": 100_000, "chunk_size": 25_000,
           "source": {"d": 12, "teacher": {"kind": "one_hidden_relu", "width": 3}, "noise_std": 0.05},
           "statistics": {"basic": {}, "contracted": {"orders": [2, 4], "directions": 4},
                          "filtered": {"quantiles": [0.3, 0.6, 0.9]}}}
    (tmp_path / "c.yaml").write_text(yaml.safe_dump(cfg))
    store, model = str(tmp_path / "s.zarr"), str(tmp_path / "m.npz")
    for n in (100_000, 200_000, 400_000):
        api.fit(config_from_dict(cfg), store, "moments", width=3, samples=n, out=model, client="local", progress=None)
    out = tmp_path / "report.html"
    done = subprocess.run([PYTHON, "-m", "relulearn.cli", "report", store, "--model", model, "--teacher",
                           str(tmp_path / "c.yaml"), "--out", str(out)], env=cli_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr
    assert "figures spectra, tau, learning, units, samples" in done.stdout and "not drawn" not in done.stdout
    page = out.read_text()
    assert len(re.findall(r"src='data:image/png;base64,", page)) == len(FIGURES)
    assert not re.search(r"(src|href)=['\"](?!data:)", page)  # self-contained: nothing fetched
    img = screenshot(out, tmp_path / "shot.png")
    for name, _ in FIGURES:
        rgb = np.array([int(FRAME_COLOURS[name][i:i + 2], 16) for i in (1, 3, 5)])
        ys, xs = np.nonzero(np.all(np.abs(img - rgb) <= 2, axis=2))
        assert len(ys) > 2000, f"the frame of figure {name} is not on the screenshot"
        inner = img[ys.min() + 12:ys.max() - 12, xs.min() + 12:xs.max() - 12]
        drawn = np.mean(np.any(inner < 200, axis=2))  # axes, ticks, points and lines
        assert 0.01 < drawn < 0.6, (name, drawn)


def test_a_report_of_a_bare_store_says_what_would_draw_each_missing_figure(tmp_path):
    cfg = {"seed": 1, "samples": 50_000, "chunk_size": 25_000, "source": {"d": 6},
           "statistics": {"basic": {}, "contracted": {"orders": [2], "directions": 2}}}
    api.estimate(config_from_dict(cfg), str(tmp_path / "s.zarr"), client="local", progress=None)
    from relulearn.report import write_report

    got = write_report(str(tmp_path / "s.zarr"), tmp_path / "r.html")
    assert got["figures"] == ["spectra"]
    assert set(got["not_drawn"]) == {"tau", "learning", "units", "samples"}
    assert "statistics.filtered" in got["not_drawn"]["tau"] and "--model and --teacher" in got["not_drawn"]["units"]
