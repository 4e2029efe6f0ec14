"""An external Dask cluster on loopback: `dask scheduler` and `dask worker` processes, started the
way deploy/README.md tells users to start them (scheduler file, one thread per worker, preload)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

from conftest import cli_env

BIN = Path(sys.executable).parent


def _dask(*args: str) -> list[str]:
    exe = BIN / "dask"
    return [str(exe), *args] if exe.exists() else [sys.executable, "-m", "dask", *args]


class ExternalCluster:
    """``dask scheduler --scheduler-file F`` plus ``dask worker --scheduler-file F --nthreads 1 ...``.

    Each process runs in its own session, so a test can SIGKILL one without touching the
    others (or the pytest process).
    """

    def __init__(
        self,
        directory: Path,
        workers: int = 2,
        env: dict | None = None,
        worker_env: list[dict] | None = None,
        preload: bool = True,
    ):
        self.dir = Path(directory)
        self.dir.mkdir(parents=True, exist_ok=True)
        self.file = str(self.dir / "scheduler.json")
        self.env = dict(cli_env(), **(env or {}))
        self.n_workers = workers
        self.worker_env = worker_env or [{}] * workers
        self.preload = ["--preload", "relulearn.pipeline.worker"] if preload else []
        self.scheduler: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.logs: list = []

    # ------------------------------------------------------------------ processes
    def _spawn(self, cmd: list[str], name: str, env: dict) -> subprocess.Popen:
        log = open(self.dir / f"{name}.log", "ab")
        self.logs.append(log)
        return subprocess.Popen(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def start_scheduler(self) -> None:
        if os.path.exists(self.file):
            os.remove(self.file)
        self.scheduler = self._spawn(
            _dask(
                "scheduler",
                "--scheduler-file",
                self.file,
                "--port",
                "0",
                "--dashboard-address",
                ":0",
                "--host",
                "127.0.0.1",
            ),
            "scheduler",
            self.env,
        )
        deadline = time.monotonic() + 60
        while not self._file_ready():
            if self.scheduler.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"dask scheduler did not start: {(self.dir / 'scheduler.log').read_text()}")
            time.sleep(0.1)

    def _file_ready(self) -> bool:
        try:
            return bool(json.loads(Path(self.file).read_text()).get("address"))
        except (OSError, ValueError):
            return False

    @property
    def address(self) -> str:
        return json.loads(Path(self.file).read_text())["address"]

    def start_workers(self) -> None:
        for i in range(self.n_workers):
            env = dict(self.env, **self.worker_env[i])
            self.workers.append(
                self._spawn(
                    _dask(
                        "worker",
                        "--scheduler-file",
                        self.file,
                        "--nthreads",
                        "1",
                        "--nworkers",
                        "1",
                        *self.preload,
                        "--host",
                        "127.0.0.1",
                        "--name",
                        f"w{i}",
                    ),
                    f"worker{i}",
                    env,
                )
            )

    def wait_for_workers(self, n: int | None = None, timeout: float = 60) -> None:
        from distributed import Client

        with Client(scheduler_file=self.file, timeout="20s") as c:
            c.wait_for_workers(n or self.n_workers, timeout=timeout)

    def start(self) -> ExternalCluster:
        self.start_scheduler()
        self.start_workers()
        self.wait_for_workers()
        return self

    def worker_processes(self) -> list[psutil.Process]:
        """The Worker processes (children of the `dask worker` nannies)."""
        out = []
        for w in self.workers:
            try:
                out.extend(psutil.Process(w.pid).children(recursive=True))
            except psutil.NoSuchProcess:
                pass
        return [p for p in out if p.is_running()]

    def kill_scheduler(self) -> None:
        os.killpg(self.scheduler.pid, signal.SIGKILL)
        self.scheduler.wait()

    def stop(self) -> None:
        for p in [*self.workers, self.scheduler]:
            if p is None:
                continue
            try:
                os.killpg(p.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            p.wait()
        self.workers = []
        for log in self.logs:
            log.close()
        self.logs = []

    def __enter__(self) -> ExternalCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
