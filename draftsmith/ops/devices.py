"""Which GPUs a job computes on when nothing else says so.

Snakemake's ``gpu`` resource only limits how many GPUs the running jobs ask for together; it does
not say which ones a job gets. On an 8-GPU machine (``--resources gpu=8``) eight one-GPU generation
jobs run side by side and every vLLM server would take GPU 0. A job that needs GPUs therefore
leases GPU ids: an exclusive ``flock`` per id, held for the job's life and released by the kernel
when the job ends, kill -9 included. Never part of a run key.

Which ids it leases from:
- no ``CUDA_VISIBLE_DEVICES``: the machine's GPUs (``nvidia-smi``), in a machine-wide folder;
- ``CUDA_VISIBLE_DEVICES`` naming exactly as many GPUs as the job needs (a SLURM job the executor
  submitted for this rule): those, nothing to lease;
- ``CUDA_VISIBLE_DEVICES`` naming more (Snakemake run inside one ``salloc``/``sbatch`` of 8 GPUs,
  its GPU jobs side by side in one allocation): a share of those. SLURM numbers an allocation's
  GPUs from 0 in every job, so the leases of a SLURM allocation sit in a folder of its own
  (``SLURM_JOB_ID``), never confused with another job's "GPU 0" on the same node.
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

log = logging.getLogger(__name__)
LEASES = Path(tempfile.gettempdir()) / "draftsmith-gpu-leases"


def machine_gpus() -> int | None:
    """The NVIDIA GPUs of this machine (``nvidia-smi --list-gpus``; asking torch would start CUDA,
    after which ``CUDA_VISIBLE_DEVICES`` no longer applies), or None where that cannot be told."""
    try:
        out = subprocess.run(["nvidia-smi", "--list-gpus"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return sum(line.startswith("GPU ") for line in out.stdout.splitlines()) if out.returncode == 0 else None


# The GPU stack of envs/requirements-gpu.txt: vLLM 0.32's CUDA wheels and their torch are built for
# CUDA 13, which needs an NVIDIA driver of this major version or newer.
GPU_STACK = "vLLM 0.32's CUDA wheels (CUDA 13)"
MIN_DRIVER = 580


def driver_version() -> str | None:
    """The NVIDIA driver of this machine (``nvidia-smi``), or None where there is none to ask."""
    try:
        out = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None
    versions = out.stdout.split()
    return versions[0] if out.returncode == 0 and versions else None


def driver_problem() -> str | None:
    """Why this machine's NVIDIA driver cannot run the GPU stack, or None (a new enough driver, or none to ask).
    Said by the preflight and by ``envs/setup-gpu.sh`` before its download."""
    driver = driver_version()
    if driver is None or int(driver.split(".")[0]) >= MIN_DRIVER:
        return None
    return (f"the NVIDIA driver here is {driver}; {GPU_STACK} needs driver {MIN_DRIVER} or newer (or install the GPU "
            "stack built for your CUDA)")


def _try_lock(path: Path) -> int | None:
    """An open descriptor holding ``path``'s exclusive lock, or None if another job holds it. Opened
    read-only: another user's jobs lock the same files."""
    fd = os.open(path, os.O_RDONLY | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        return None
    return fd


@contextlib.contextmanager
def lease(count: int, ids: list[str], folder: Path | None = None, poll_s: float = 5.0) -> Iterator[list[str]]:
    """``count`` of the GPU ``ids`` held by no other job, waiting for them if need be. All or none: a
    job never sits on some ids while it waits for more (two jobs could wait on each other)."""
    if count > len(ids):
        raise ValueError(f"the job needs {count} GPUs and {len(ids)} are visible to it ({','.join(ids)})")
    folder = folder or LEASES
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # every user's jobs lease from the same GPUs
        folder.chmod(0o1777)
    held: dict[str, int] = {}
    waited = False
    try:
        while True:
            for gpu in ids:
                if len(held) < count and (fd := _try_lock(folder / f"gpu{gpu}.lock")) is not None:
                    held[gpu] = fd
            if len(held) == count:
                break
            for fd in held.values():
                os.close(fd)
            held.clear()
            if not waited:
                log.info("waiting for %d free GPUs of %s (other jobs hold the rest; leases in %s)", count,
                         ",".join(ids), folder)
                waited = True
            time.sleep(poll_s)
        yield [gpu for gpu in ids if gpu in held]
    finally:
        for fd in held.values():
            os.close(fd)


def _lease_pool() -> tuple[list[str], Path] | None:
    """The GPU ids a job leases from and the folder of their leases, or None where none can be told."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        ids = [gpu.strip() for gpu in visible.split(",") if gpu.strip()]
        allocation = os.environ.get("SLURM_JOB_ID")
        return ids, (LEASES / f"slurm-{allocation}" if allocation else LEASES)
    total = machine_gpus()
    return ([str(gpu) for gpu in range(total)], LEASES) if total is not None else None


@contextlib.contextmanager
def for_job(gpus: int) -> Iterator[None]:
    """Run the job's body on ``gpus`` leased GPUs (``CUDA_VISIBLE_DEVICES`` set for it and for the
    servers it starts), unless it needs none or what it sees is exactly its own."""
    pool = _lease_pool() if gpus else None
    if not gpus or (pool is not None and len(pool[0]) == gpus):
        yield
        return
    if pool is None:
        log.warning("the job asks for %d GPUs but nvidia-smi cannot list this machine's: it sees every GPU, "
                    "and jobs running side by side may share them", gpus)
        yield
        return
    ids, folder = pool
    with lease(gpus, ids, folder) as mine:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(mine)
        log.info("GPUs %s leased for this job (of %s)", ",".join(mine), ",".join(ids))
        yield
