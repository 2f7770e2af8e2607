"""Stopping Snakemake stops the jobs it runs.

Snakemake's local executor takes SIGTERM as "start no new job, let the running ones finish", and
on SIGINT it waits for them too: a training job kept training for minutes after a supervisor or
``timeout`` had stopped the workflow. The Snakefile's ``onstart`` hook installs
:func:`forward_stops_to_jobs` in the main Snakemake process: on SIGTERM or SIGINT every process it
started gets SIGTERM first (training saves a resumable checkpoint, generation keeps its journal,
managed servers stop), then Snakemake's own handling goes on.
"""

from __future__ import annotations

import contextlib
import os
import signal

import psutil


def terminate_descendants() -> list[int]:
    """SIGTERM every process below this one; returns their pids."""
    children = psutil.Process().children(recursive=True)
    for child in children:
        with contextlib.suppress(psutil.NoSuchProcess):
            child.terminate()
    return [c.pid for c in children]


def forward_stops_to_jobs() -> None:
    for sig in (signal.SIGTERM, signal.SIGINT):
        previous = signal.getsignal(sig)

        def handler(signum, frame, previous=previous):
            terminate_descendants()
            if callable(previous):
                previous(signum, frame)
            elif signum == signal.SIGINT:
                raise KeyboardInterrupt
            else:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

        signal.signal(sig, handler)
