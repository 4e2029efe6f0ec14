"""Array files are sized from their headers before anything is allocated: an ``.npy`` or ``.npz`` member whose
header claims more than the file holds, or more than this machine holds, is refused in one line naming the file."""

from __future__ import annotations

import tracemalloc
import zipfile

import numpy as np
import pytest
import yaml
from numpy.lib import format as npformat

from conftest import relulearn

HUGE = 10**12  # rows a header claims: 8 TB of float64


def npy_bytes(shape: tuple[int, ...], data: bytes = b"") -> bytes:
    """A version 1.0 ``.npy`` header claiming ``shape`` of float64, followed by ``data``."""
    import io

    buf = io.BytesIO()
    npformat.write_array_header_1_0(buf, {"descr": "<f8", "fortran_order": False, "shape": shape})
    return buf.getvalue() + data


def network_npz(path, members: dict[str, bytes]) -> None:
    """An ``.npz`` of raw members (``W0.npy``, …), deflated as ``np.savez_compressed`` does."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, raw in members.items():
            zf.writestr(name + ".npy", raw)


def refused_one_line(result, *names: str) -> str:
    assert result.returncode == 2, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("relulearn: error: "), result.stderr
    assert "Traceback" not in result.stderr
    for name in names:
        assert name in lines[0], lines[0]
    return lines[0]


def good_net(path) -> None:
    rng = np.random.default_rng(0)
    np.savez(path, W0=rng.standard_normal((3, 4)), W1=rng.standard_normal((1, 3)))


def test_predict_refuses_input_header_claiming_huge_shape(tmp_path):
    good_net(tmp_path / "net.npz")
    (tmp_path / "x.npy").write_bytes(npy_bytes((HUGE, 4), np.zeros(8).tobytes()))
    line = refused_one_line(
        relulearn("predict", tmp_path / "net.npz", "--input", tmp_path / "x.npy", "--out", tmp_path / "y.npy"), "x.npy"
    )
    assert "32000000000000" in line.replace(",", "")  # the bytes its header claims
    assert not (tmp_path / "y.npy").exists()


def test_predict_refuses_truncated_input_naming_expected_and_actual_bytes(tmp_path):
    good_net(tmp_path / "net.npz")
    np.save(tmp_path / "x.npy", np.ones((100, 4)))
    raw = (tmp_path / "x.npy").read_bytes()
    (tmp_path / "x.npy").write_bytes(raw[:-40])  # 5 values short
    header = len(raw) - 3200
    line = refused_one_line(
        relulearn("predict", tmp_path / "net.npz", "--input", tmp_path / "x.npy", "--out", tmp_path / "y.npy"),
        "x.npy",
        "truncated",
    )
    assert "3200" in line.replace(",", "") and "3160" in line.replace(",", ""), line  # expected and actual data bytes
    assert header > 0


def test_evaluate_refuses_model_npz_member_claiming_huge_shape(tmp_path):
    good_net(tmp_path / "teacher.npz")
    network_npz(tmp_path / "model.npz", {"W0": npy_bytes((HUGE, 4)), "W1": npy_bytes((1, 3), bytes(24))})
    refused_one_line(
        relulearn("evaluate", tmp_path / "model.npz", "--teacher", tmp_path / "teacher.npz"), "model.npz", "W0"
    )


def test_npz_bomb_refused_before_inflating(tmp_path):
    """50 MB of zeros deflate to 50 kB: a header claiming 8 TB is refused from the headers, the member never
    inflated (the allocations traced stay far below its size)."""
    good_net(tmp_path / "teacher.npz")
    network_npz(tmp_path / "bomb.npz", {"W0": npy_bytes((HUGE, 4), bytes(50_000_000)), "W1": npy_bytes((1, 3))})
    assert (tmp_path / "bomb.npz").stat().st_size < 1_000_000
    tracemalloc.start()
    try:
        result = relulearn("evaluate", tmp_path / "bomb.npz", "--teacher", tmp_path / "teacher.npz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    refused_one_line(result, "bomb.npz", "W0")
    assert peak < 20_000_000, peak


def test_npz_member_data_not_matching_its_header_refused(tmp_path):
    """A member holding other bytes than its header's shape (a lie either way) is refused naming both sizes."""
    good_net(tmp_path / "teacher.npz")
    network_npz(tmp_path / "m.npz", {"W0": npy_bytes((3, 4), bytes(8 * 11)), "W1": npy_bytes((1, 3), bytes(24))})
    line = refused_one_line(
        relulearn("evaluate", tmp_path / "m.npz", "--teacher", tmp_path / "teacher.npz"), "m.npz", "W0"
    )
    assert "96 bytes" in line and "88 bytes" in line, line


@pytest.mark.parametrize("case", ["huge", "truncated"])
def test_estimate_refuses_teacher_and_data_headers(tmp_path, case):
    """The teacher file and the data files of ``estimate``: refused before the run, the store never created."""
    if case == "huge":
        network_npz(tmp_path / "t.npz", {"W0": npy_bytes((HUGE, 4)), "W1": npy_bytes((1, 3), bytes(24))})
        source = {"d": 4, "teacher": {"file": str(tmp_path / "t.npz")}}
        name = "t.npz"
    else:
        np.save(tmp_path / "x.npy", np.ones((1000, 4)))
        np.save(tmp_path / "y.npy", np.ones(1000))
        raw = (tmp_path / "x.npy").read_bytes()
        (tmp_path / "x.npy").write_bytes(raw[:-8])
        source = {"d": 4, "data": {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}}
        name = "x.npy"
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"seed": 0, "samples": 1000, "chunk_size": 500, "source": source}))
    line = refused_one_line(relulearn("estimate", cfg, "--store", tmp_path / "s.zarr"), name)
    if case == "truncated":
        assert "32000" in line.replace(",", "") and "31992" in line.replace(",", ""), line
    assert not (tmp_path / "s.zarr").exists()


@pytest.mark.parametrize("route", ["data y", "teacher file", "predict's model", "exact-arbitrary's labels"])
def test_a_truncated_array_is_named_as_truncated_on_every_route(tmp_path, route):
    """A truncated ``.npy`` (or ``.npz`` member) was a reshape error: each route that reads one names the file, the
    member and the bytes its header claims beside those it holds; nothing is written."""
    rng = np.random.default_rng(1)
    np.save(tmp_path / "x.npy", rng.standard_normal((1000, 4)))
    np.save(tmp_path / "y.npy", rng.standard_normal(1000))
    good_net(tmp_path / "net.npz")
    short = npy_bytes((3, 4), bytes(8 * 11))  # W0 one value short: 88 of its 96 bytes
    network_npz(tmp_path / "cut.npz", {"W0": short, "W1": npy_bytes((1, 3), bytes(24))})
    if route in ("data y", "exact-arbitrary's labels"):
        raw = (tmp_path / "y.npy").read_bytes()
        (tmp_path / "y.npy").write_bytes(raw[:-8])
    store, out = tmp_path / "s.zarr", tmp_path / "p.npy"
    if route == "data y":
        source = {"d": 4, "data": {"x": str(tmp_path / "x.npy"), "y": str(tmp_path / "y.npy")}}
    else:
        source = {"d": 4, "teacher": {"file": str(tmp_path / "cut.npz")}}
    cfg = tmp_path / "run.yaml"
    cfg.write_text(yaml.safe_dump({"seed": 0, "samples": 1000, "chunk_size": 500, "source": source}))
    args = {
        "data y": ("estimate", cfg, "--store", store),
        "teacher file": ("estimate", cfg, "--store", store),
        "predict's model": ("predict", tmp_path / "cut.npz", "--input", tmp_path / "x.npy", "--out", out),
        "exact-arbitrary's labels": (
            "exact-arbitrary",
            tmp_path / "x.npy",
            tmp_path / "y.npy",
            "--width",
            2,
            "--out",
            out,
        ),
    }[route]
    if route in ("data y", "exact-arbitrary's labels"):
        line = refused_one_line(relulearn(*args), "y.npy", "is truncated")
        assert "8,000 bytes of data" in line and "7,992 bytes" in line, line
    else:
        line = refused_one_line(relulearn(*args), "cut.npz (member W0) is truncated")
        assert "96 bytes of data" in line and "88 bytes" in line, line
    assert not store.exists() and not out.exists()


def test_an_npy_of_an_unknown_format_version_is_refused_and_version_3_is_read(tmp_path):
    """numpy writes .npy versions 1.0, 2.0 and 3.0 (a utf-8 header); any other version is refused in one line
    naming the file and its version, and a 3.0 file is predicted as its 1.0 twin is."""
    import io

    good_net(tmp_path / "net.npz")
    x = np.random.default_rng(1).standard_normal((30, 4))
    buf = io.BytesIO()
    npformat.write_array(buf, x, version=(3, 0))
    (tmp_path / "x3.npy").write_bytes(buf.getvalue())
    np.save(tmp_path / "x1.npy", x)
    for name in ("x1", "x3"):
        done = relulearn(
            "predict", tmp_path / "net.npz", "--input", tmp_path / f"{name}.npy", "--out", tmp_path / f"{name}-y.npy"
        )
        assert done.returncode == 0, done.stderr
    assert np.array_equal(np.load(tmp_path / "x1-y.npy"), np.load(tmp_path / "x3-y.npy"))
    raw = (tmp_path / "x1.npy").read_bytes()
    (tmp_path / "x9.npy").write_bytes(raw[:6] + b"\x09\x00" + raw[8:])
    line = refused_one_line(
        relulearn("predict", tmp_path / "net.npz", "--input", tmp_path / "x9.npy", "--out", tmp_path / "y.npy"),
        "x9.npy",
        "format version 9.0",
    )
    assert "numpy.save" in line and not (tmp_path / "y.npy").exists()
