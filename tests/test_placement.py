"""The online train job gives its target server and its trainer separate devices."""

from __future__ import annotations

import pytest

from draftsmith.training import placement


def test_gpus_are_split_server_first_from_what_the_job_sees():
    eight = placement.online(4, 4, threads=16)
    assert eight.server_env == {"CUDA_VISIBLE_DEVICES": "0,1,2,3"}
    assert eight.trainer_env == {"CUDA_VISIBLE_DEVICES": "4,5,6,7"}
    slurm = placement.online(2, 1, threads=8, visible_gpus="2,3,6,7")  # a scheduler's allocation
    assert slurm.server_env["CUDA_VISIBLE_DEVICES"] == "2,3" and slurm.trainer_env["CUDA_VISIBLE_DEVICES"] == "6"
    assert slurm.trainer_threads is None


def test_too_few_gpus_for_both_is_a_clear_error():
    with pytest.raises(placement.PlacementError, match=r"server.gpus 2 \+ train.gpus 2 = 4 GPUs.*sees 2 "
                                                       r"\(CUDA_VISIBLE_DEVICES='0,1'\)"):
        placement.online(2, 2, threads=8, visible_gpus="0,1")


def test_cpu_cores_of_the_job_are_halved():
    two = placement.online(0, 0, threads=2, allowed_cpus={0, 1})
    assert two.server_env == {"VLLM_CPU_OMP_THREADS_BIND": "0"} and two.trainer_threads == 1
    assert two.trainer_env == {}
    big = placement.online(0, 0, threads=4, allowed_cpus=set(range(16)))  # the job's threads, not the machine
    assert big.server_env == {"VLLM_CPU_OMP_THREADS_BIND": "0,1"} and big.trainer_threads == 2
    one = placement.online(0, 0, threads=1, allowed_cpus={0, 1})
    assert one.server_env == {} and one.trainer_threads is None and "share" in one.summary
