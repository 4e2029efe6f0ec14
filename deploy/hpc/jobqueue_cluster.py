"""relulearn on a Slurm cluster through dask-jobqueue (``pip install dask-jobqueue``).

This script is the driver: it starts a Dask scheduler in its own process, submits Slurm jobs
that each run one single-threaded worker process per core, waits for the workers, then runs
``relulearn.api.fit`` (or ``estimate``) on that cluster and writes the store. Run it where the
compute nodes can reach it — a login node if your site allows long-running processes there,
otherwise inside a small batch or interactive job:

    python deploy/hpc/jobqueue_cluster.py fit examples/large.yaml --store $SCRATCH/runs/large.zarr \\
        --out $SCRATCH/runs/large.npz --jobs 4 --cores 32 --memory 120GB --walltime 04:00:00 \\
        --account myproject --interface ib0

Resume: run the same command again; the store resumes where its last commit left it
(``run.commit_interval``). Worker jobs that end (walltime, preemption) cost only their blocks in
flight; ``--jobs`` more can be started, or the whole command re-run.

From Python, build the cluster with :func:`make_cluster` and hand its client to the API::

    from distributed import Client
    import relulearn.api
    from jobqueue_cluster import make_cluster

    with make_cluster(cores=32, memory="120GB", walltime="04:00:00") as cluster:
        cluster.scale(jobs=4)
        with Client(cluster) as client:
            client.wait_for_workers(4 * 32)
            relulearn.api.fit("examples/large.yaml", "large.zarr", "moments", out="large.npz", client=client)
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Optional, Sequence

PRELOAD = "relulearn.pipeline.worker"

# One BLAS thread per worker process from the start (the preload enforces it too, but these keep
# OpenBLAS/MKL from starting a thread pool per process at import).
SINGLE_THREAD_ENV = ["export OMP_NUM_THREADS=1", "export OPENBLAS_NUM_THREADS=1", "export MKL_NUM_THREADS=1",
                     # Dask's profiler keeps a growing history per worker (README: Dask settings)
                     "export DASK_DISTRIBUTED__WORKER__PROFILE__ENABLED=False"]


def make_cluster(*, cores: int = 32, memory: str = "120GB", walltime: str = "04:00:00",
                 queue: Optional[str] = None, account: Optional[str] = None,
                 interface: Optional[str] = None, local_directory: Optional[str] = None,
                 prologue: Sequence[str] = (), job_extra_directives: Sequence[str] = (),
                 **kwargs: Any):
    """A ``dask_jobqueue.SLURMCluster`` whose every job is one node's worth of relulearn workers.

    Each job asks for ``cores`` CPUs and ``memory`` on one node and runs ``cores`` worker
    processes of one thread each (``processes=cores``: ``--nworkers cores --nthreads 1``), each
    with the relulearn preload (one BLAS thread, malloc tuning). ``prologue`` lines run in the job
    script before the workers start (``module load ...``, ``source venv/bin/activate``): the
    workers must have the driver's relulearn (checked before any block runs) and, for bitwise
    results, its numpy and BLAS. Further keyword arguments go to ``SLURMCluster``.
    """
    from dask_jobqueue import SLURMCluster

    return SLURMCluster(
        cores=cores,
        processes=cores,
        memory=memory,
        walltime=walltime,
        job_cpu=cores,
        queue=queue,
        account=account,
        interface=interface,
        local_directory=local_directory,
        worker_extra_args=["--preload", PRELOAD],
        job_script_prologue=[*SINGLE_THREAD_ENV, *prologue],
        job_extra_directives=list(job_extra_directives),
        **kwargs,
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="jobqueue_cluster.py",
        description="Run relulearn fit or estimate on Slurm worker jobs started by dask-jobqueue.")
    p.add_argument("command", choices=["fit", "estimate"], help="fit: estimate, then learn; estimate: statistics only")
    p.add_argument("config", help="run configuration (YAML)")
    p.add_argument("--store", required=True, help="store location (a directory on a shared filesystem, or an fsspec URL)")
    p.add_argument("--samples", type=int, help="total samples (default: the configuration's)")
    p.add_argument("--method", default="moments", help="learning method for fit (default moments)")
    p.add_argument("--out", help="where fit writes the learned network (.npz)")
    p.add_argument("--jobs", type=int, default=1, help="Slurm jobs (nodes) of workers (default 1)")
    p.add_argument("--cores", type=int, default=32, help="CPUs per job = single-threaded worker processes per job")
    p.add_argument("--memory", default="120GB", help="memory per job (default 120GB)")
    p.add_argument("--walltime", default="04:00:00", help="walltime of each worker job (default 04:00:00)")
    p.add_argument("--queue", help="Slurm partition")
    p.add_argument("--account", help="Slurm account")
    p.add_argument("--interface", help="network interface the workers reach the scheduler on, e.g. ib0")
    p.add_argument("--local-directory", help="node-local scratch directory for the workers (e.g. '$TMPDIR')")
    p.add_argument("--dashboard-address", default=":8787",
                   help="the scheduler's dashboard address (default :8787; :0 picks a free port)")
    p.add_argument("--prologue", action="append", default=[],
                   help="a line to run in each job before the workers start (repeatable)")
    p.add_argument("--wait-timeout", type=float, default=3600.0,
                   help="seconds to wait for all workers before starting with those present (default 3600)")
    return p


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    if args.command == "fit" and not args.out:
        print("jobqueue_cluster.py: error: fit needs --out MODEL.npz", file=sys.stderr)
        return 2

    import relulearn
    import relulearn.api
    from distributed import Client

    with make_cluster(cores=args.cores, memory=args.memory, walltime=args.walltime, queue=args.queue,
                      account=args.account, interface=args.interface, local_directory=args.local_directory,
                      prologue=args.prologue,
                      scheduler_options={"dashboard_address": args.dashboard_address}) as cluster:
        cluster.scale(jobs=args.jobs)
        with Client(cluster) as client:
            print(f"scheduler {cluster.scheduler_address}, dashboard {cluster.dashboard_link}", file=sys.stderr)
            try:
                # the driver checks the workers' relulearn version once, when it starts
                client.wait_for_workers(args.jobs * args.cores, timeout=args.wait_timeout)
            except TimeoutError:
                n = len(client.scheduler_info()["workers"])
                print(f"jobqueue_cluster.py: {n} of {args.jobs * args.cores} workers after "
                      f"{args.wait_timeout:g} s; starting with those", file=sys.stderr)
            try:
                if args.command == "fit":
                    result = relulearn.api.fit(args.config, args.store, args.method, out=args.out,
                                               samples=args.samples, client=client)
                else:
                    result = relulearn.api.estimate(args.config, args.store, samples=args.samples,
                                                    client=client).to_dict()
            except (relulearn.ConfigError, relulearn.StoreError, ValueError, OSError) as err:
                print(f"jobqueue_cluster.py: error: {err}", file=sys.stderr)
                return 2
            except KeyboardInterrupt:
                print("jobqueue_cluster.py: interrupted; every merged block was committed. "
                      "Run the same command to resume.", file=sys.stderr)
                return 130
    print(json.dumps(result, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
