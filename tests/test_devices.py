"""GPU leases for jobs side by side on one machine (no GPU needed: the leases are files)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

from draftsmith.ops import devices
from tests.conftest import REPO

HOLD = """import sys, time
from pathlib import Path
from draftsmith.ops import devices
with devices.lease(int(sys.argv[1]), ["0", "1", "2", "3"], Path(sys.argv[2])) as ids:
    print(",".join(ids), flush=True)
    time.sleep(600)
"""


FOUR = ["0", "1", "2", "3"]


def lease_within(count: int, folder, seconds: float = 10) -> list[str]:
    """A lease of ``count`` of 4 taken (and given back) within ``seconds``, else [] — a lease that is
    never freed fails the test instead of hanging it."""
    got: list[str] = []

    def take():
        with devices.lease(count, FOUR, folder, poll_s=0.05) as ids:
            got.extend(ids)

    threading.Thread(target=take, daemon=True).start()
    deadline = time.monotonic() + seconds
    while not got and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def holder(count: int, folder) -> tuple[subprocess.Popen, list[str]]:
    """Another job holding ``count`` of 4 GPUs."""
    proc = subprocess.Popen([sys.executable, "-c", HOLD, str(count), str(folder)], stdout=subprocess.PIPE, text=True,
                            cwd=REPO)
    return proc, proc.stdout.readline().strip().split(",")


def test_jobs_side_by_side_get_different_gpus_and_a_kill_frees_them(tmp_path):
    other, theirs = holder(2, tmp_path)
    try:
        with devices.lease(2, FOUR, tmp_path) as mine:
            assert len(mine) == 2 and not set(mine) & set(theirs)
    finally:
        other.send_signal(signal.SIGKILL)
        other.wait()
    assert lease_within(4, tmp_path) == FOUR  # the killed job's leases went with it


def test_a_job_waits_holding_nothing_until_enough_are_free(tmp_path):
    other, theirs = holder(3, tmp_path)
    got: list[str] = []

    def wait_for_two():
        with devices.lease(2, FOUR, tmp_path, poll_s=0.05) as ids:
            got.extend(ids)

    threading.Thread(target=wait_for_two, daemon=True).start()
    time.sleep(0.5)
    assert not got
    # While it waits it holds no id: a third job can still take the free one.
    free = lease_within(1, tmp_path)
    assert len(free) == 1 and not set(free) & set(theirs)
    other.send_signal(signal.SIGKILL)
    other.wait()
    deadline = time.monotonic() + 10
    while len(got) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(got) == 2


def test_a_scheduler_choice_or_no_gpu_is_left_alone(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")
    with devices.for_job(1):
        assert os.environ["CUDA_VISIBLE_DEVICES"] == "3"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    with devices.for_job(0):
        assert "CUDA_VISIBLE_DEVICES" not in os.environ
    with pytest.raises(ValueError, match="needs 5 GPUs and 4 are visible"), devices.lease(5, FOUR):
        pass


def test_two_gpu_jobs_in_one_slurm_allocation_share_it_without_overlap(monkeypatch, tmp_path):
    """Snakemake inside one `salloc` of 4 GPUs: every job sees CUDA_VISIBLE_DEVICES=0,1,2,3 (SLURM
    numbers the allocation's GPUs from 0), so two 2-GPU jobs side by side must lease within it."""
    monkeypatch.setattr(devices, "LEASES", tmp_path)
    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
    other, theirs = holder(2, tmp_path / "slurm-4242")  # the first job of the allocation
    try:
        with devices.for_job(2):
            mine = os.environ["CUDA_VISIBLE_DEVICES"].split(",")
            assert len(mine) == 2 and not set(mine) & set(theirs)
        # Another allocation on the same node numbers its GPUs from 0 too: its leases are its own.
        monkeypatch.setenv("SLURM_JOB_ID", "4243")
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1,2,3")
        with devices.for_job(2):
            assert os.environ["CUDA_VISIBLE_DEVICES"] == ",".join(theirs) == "0,1"
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
        with pytest.raises(ValueError, match="needs 4 GPUs and 2 are visible"), devices.for_job(4):
            pass
    finally:
        other.kill()
        other.wait()


def test_a_job_on_a_machine_with_gpus_sees_only_its_lease(monkeypatch, tmp_path):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.setattr(devices, "machine_gpus", lambda: 8)
    monkeypatch.setattr(devices, "LEASES", tmp_path)
    other, theirs = holder(1, tmp_path)  # the holder leases from 4 of them: id 0
    try:
        with devices.for_job(2):
            assert os.environ["CUDA_VISIBLE_DEVICES"] == "1,2" and theirs == ["0"]
    finally:  # monkeypatch takes CUDA_VISIBLE_DEVICES away again
        other.kill()
        other.wait()
