"""Where the online train job's target server and trainer each compute.

In online mode (``hidden_states.mode: online``) one job serves the target and trains beside it. Left
alone, both take the same devices: on GPUs the server's tensor-parallel ranks claim GPUs 0..N-1 with
most of their memory and the trainer's rank 0 lands on GPU 0 too; on a CPU the server binds its
OpenMP threads to every core and the trainer's threads spin on the same ones (a 2-core online run
trained at 2.2-3 s a step against 0.6 s offline). The job asked for ``server.gpus + train.gpus``
GPUs (or its threads): the server gets the first ``server.gpus`` of the devices the job sees, the
trainer the next ``train.gpus``; on a CPU the cores are halved. Operational only: nothing here
enters a run key.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field


class PlacementError(ValueError):
    pass


@dataclass(frozen=True)
class Placement:
    server_env: dict[str, str] = field(default_factory=dict)  # added to the server's environment
    trainer_env: dict[str, str] = field(default_factory=dict)  # set in the trainer before CUDA starts
    trainer_threads: int | None = None  # torch threads of the trainer (CPU), None: the job's
    summary: str = ""


def online(server_gpus: int, train_gpus: int, threads: int, visible_gpus: str | None = None,
           allowed_cpus: set[int] | None = None) -> Placement:
    """The split for a job of ``threads`` threads that sees ``visible_gpus`` (``CUDA_VISIBLE_DEVICES``;
    unset: devices 0, 1, ...) and may run on ``allowed_cpus`` (its affinity)."""
    if server_gpus or train_gpus:
        return _gpus(server_gpus, train_gpus, visible_gpus)
    cores = sorted(allowed_cpus if allowed_cpus is not None else os.sched_getaffinity(0))[:max(threads, 1)]
    if len(cores) < 2:
        return Placement(summary=f"one core ({cores}): the server and the trainer share it")
    server, trainer = cores[:len(cores) // 2], cores[len(cores) // 2:]
    return Placement(server_env={"VLLM_CPU_OMP_THREADS_BIND": ",".join(map(str, server))},
                     trainer_threads=len(trainer),
                     summary=f"server on cores {server}, trainer on {len(trainer)} thread(s) of {trainer}")


def _gpus(server_gpus: int, train_gpus: int, visible: str | None) -> Placement:
    need = server_gpus + train_gpus
    devices = [d for d in visible.split(",") if d.strip()] if visible is not None else [str(i) for i in range(need)]
    if len(devices) < need:
        raise PlacementError(f"online hidden states need server.gpus {server_gpus} + train.gpus {train_gpus} = "
                             f"{need} GPUs in the train job; it sees {len(devices)} "
                             f"(CUDA_VISIBLE_DEVICES={visible!r})")
    server, trainer = devices[:server_gpus], devices[server_gpus:need]
    return Placement(server_env={"CUDA_VISIBLE_DEVICES": ",".join(server)},
                     trainer_env={"CUDA_VISIBLE_DEVICES": ",".join(trainer)},
                     summary=f"server on GPUs {server}, trainer on GPUs {trainer}")


def apply_to_trainer(placement: Placement) -> None:
    """In the train job's own process, before anything starts CUDA or torch's thread pool."""
    os.environ.update(placement.trainer_env)
    if placement.trainer_threads:
        import torch

        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(placement.trainer_threads)
        torch.set_num_threads(placement.trainer_threads)
