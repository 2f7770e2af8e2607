"""Which GPUs a job computes on when nothing else says so.

Snakemake's ``gpu`` resource only limits how many GPUs the running jobs ask for together; it does
not say which ones a job gets. On an 8-GPU machine (``--resources gpu=8``) eight one-GPU generation
jobs run side by side and every vLLM server would take GPU 0. A job that needs GPUs and finds no
``CUDA_VISIBLE_DEVICES`` (which SLURM and other schedulers set) therefore leases GPU ids: an
exclusive ``flock`` per id in a machine-wide folder, held for the job's life and released by the
kernel when the job ends, kill -9 included. Never part of a run key.
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
def lease(count: int, total: int, folder: Path | None = None, poll_s: float = 5.0) -> Iterator[list[int]]:
    """``count`` of GPU ids 0..total-1 held by no other job, waiting for them if need be. All or
    none: a job never sits on some ids while it waits for more (two jobs could wait on each other)."""
    if count > total:
        raise ValueError(f"the job needs {count} GPUs and this machine has {total}")
    folder = folder or LEASES
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(PermissionError):  # every user's jobs lease from the same GPUs
        folder.chmod(0o1777)
    held: dict[int, int] = {}
    waited = False
    try:
        while True:
            for gpu in range(total):
                if len(held) < count and (fd := _try_lock(folder / f"gpu{gpu}.lock")) is not None:
                    held[gpu] = fd
            if len(held) == count:
                break
            for fd in held.values():
                os.close(fd)
            held.clear()
            if not waited:
                log.info("waiting for %d free GPUs of %d (other jobs hold the rest; leases in %s)", count, total,
                         folder)
                waited = True
            time.sleep(poll_s)
        yield sorted(held)
    finally:
        for fd in held.values():
            os.close(fd)


@contextlib.contextmanager
def for_job(gpus: int) -> Iterator[None]:
    """Run the job's body on ``gpus`` leased GPUs (``CUDA_VISIBLE_DEVICES`` set for it and for the
    servers it starts), unless it needs none or a scheduler already chose them."""
    if not gpus or "CUDA_VISIBLE_DEVICES" in os.environ:
        yield
        return
    total = machine_gpus()
    if total is None:
        log.warning("the job asks for %d GPUs but nvidia-smi cannot list this machine's: it sees every GPU, "
                    "and jobs running side by side may share them", gpus)
        yield
        return
    with lease(gpus, total) as ids:
        os.environ["CUDA_VISIBLE_DEVICES"] = ",".join(map(str, ids))
        log.info("GPUs %s leased for this job", ids)
        yield
