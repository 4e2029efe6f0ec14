"""Model and report files are written whole or not at all (relulearn.atomic), at paths and file:// URLs (s3://:
tests/storage/test_s3.py)."""

from __future__ import annotations

import os
import signal
import stat
import subprocess
import sys
import time

import numpy as np
import pytest

from relulearn.network import Network

WRITER = """
import sys
import numpy as np
from relulearn.network import Network
rng = np.random.default_rng(int(sys.argv[2]))
net = Network((rng.standard_normal((1500, 1500)), rng.standard_normal((1, 1500))), activation="relu")
print("ready", flush=True)
while True:
    net.save(sys.argv[1])
"""


def test_a_model_file_killed_mid_write_is_the_old_or_the_new_file_never_a_broken_one(tmp_path):
    """A process saving an 18 MB network over and over is SIGKILLed at 6 moments: after each kill the file loads
    and is bitwise one of the two networks written, and no temporary file is left but at most the one the killed
    write had open."""
    path = tmp_path / "model.npz"
    old = Network((np.eye(3), np.ones((1, 3))), activation="relu")
    old.save(path)
    new = np.random.default_rng(7).standard_normal((1500, 1500))
    for trial in range(6):
        proc = subprocess.Popen([sys.executable, "-c", WRITER, str(path), "7"], stdout=subprocess.PIPE)
        assert proc.stdout.readline().strip() == b"ready"
        time.sleep(0.02 + 0.1 * trial)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        got = Network.load(path)
        assert np.array_equal(got.weights[0], old.weights[0]) or np.array_equal(got.weights[0], new), trial
        leftovers = [p.name for p in tmp_path.iterdir() if p.name != "model.npz"]
        assert len(leftovers) <= 1 and all(p.startswith(".model.npz.") for p in leftovers), leftovers
        for name in leftovers:
            (tmp_path / name).unlink()


FULL = """
import resource, signal, sys
from relulearn.atomic import write_text
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))  # a write past 4 kB fails, as on a full disk (EFBIG)
try:
    write_text(sys.argv[1], "x" * 100_000)
except OSError as err:
    print(err)
"""


@pytest.mark.parametrize("url", [False, True], ids=["path", "file-url"])
def test_a_write_the_file_system_refuses_names_the_file_and_leaves_it_unchanged(tmp_path, url):
    """A write that fails part way (a file-size limit: the same failure as a full disk, root included) raises an
    error naming the file; the file keeps its old content and no temporary file is left."""
    path = tmp_path / "report.json"
    path.write_text("before")
    target = f"file://{path}" if url else str(path)
    out = subprocess.run([sys.executable, "-c", FULL, target], capture_output=True, text=True, check=True).stdout
    assert "report.json" in out and "unchanged" in out, out
    assert path.read_text() == "before" and [p.name for p in tmp_path.iterdir()] == ["report.json"]


@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_a_written_file_has_the_mode_the_umask_gives_a_new_file(tmp_path, umask):
    """Not the temporary file's 0600: a model is as readable as a file ``open`` creates (a new one, and one
    written over a file of another mode)."""
    from relulearn.atomic import write_text

    old = os.umask(umask)
    try:
        (tmp_path / "over.txt").write_text("x")
        os.chmod(tmp_path / "over.txt", 0o600)
        for name in ("new.txt", "over.txt"):
            write_text(tmp_path / name, "y")
        with open(tmp_path / "plain.txt", "w") as f:
            f.write("z")
    finally:
        os.umask(old)
    modes = {p.name: stat.S_IMODE(p.stat().st_mode) for p in tmp_path.iterdir()}
    assert modes == dict.fromkeys(("new.txt", "over.txt", "plain.txt"), 0o666 & ~umask), modes


def test_a_network_at_a_file_url_is_written_and_read_back_bitwise(tmp_path):
    """``file://`` URLs are local paths: ``.npz`` appended as ``np.savez`` does, read back bit for bit."""
    net = Network((np.random.default_rng(1).standard_normal((4, 3)), np.ones((1, 4))), activation="erf")
    net.save(f"file://{tmp_path}/m")
    back = Network.load(f"file://{tmp_path}/m.npz")
    assert [p.name for p in tmp_path.iterdir()] == ["m.npz"]
    assert back.activation == "erf" and all(np.array_equal(a, b) for a, b in zip(net.weights, back.weights))
