"""Shared start-up for the thin ``scripts/*.py`` adapters: logging to the rule's log, clean errors.

A failure the user can act on (bad input, server that would not start, full disk) ends the job
with one clear line on stderr; the traceback goes only to the rule's log, for whoever debugs.
"""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from draftsmith.config.load import ConfigError
from draftsmith.config.target import Target, resolve
from draftsmith.generation.client import RequestFailed
from draftsmith.generation.generate import GenerationFailed, GenerationInterrupted
from draftsmith.generation.server import ServerError
from draftsmith.hidden_states.extract import ExtractionFailed
from draftsmith.ops import devices, spent
from draftsmith.training.train import TrainingInterrupted

USER_ERRORS = (ValueError, FileNotFoundError, OSError, ServerError, RequestFailed, httpx.HTTPStatusError, ConfigError,
               GenerationInterrupted, GenerationFailed, ExtractionFailed, TrainingInterrupted, KeyboardInterrupt)


def base_dir(sm) -> Path:
    """The workflow folder (relative prompt paths start there), found from the script's own place so
    that no absolute path has to travel in rule params. Snakemake gives ``rules/../scripts``: normalized,
    so messages name ``/repo/data/x.jsonl``, not ``/repo/rules/../data/x.jsonl``."""
    return Path(os.path.normpath(sm.scriptdir)).parent


def target_of(sm) -> Target:
    return resolve(sm.config["target"], base_dir(sm))


def run(main: Callable[[], None], log_path: str, threads: int | None = None, gpus: int = 0) -> None:
    """Run a job's ``main`` with its log set up, on ``threads`` threads and ``gpus`` GPUs of its own."""
    if threads:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ[var] = str(threads)
    console = sys.stderr
    log_file = open(log_path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - lives for the job
    sys.stderr = log_file  # progress bars and library warnings land in the rule's log too
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        handlers=[logging.StreamHandler(log_file)], force=True)
    for name in ("httpx", "httpx2"):  # one line per request drowns the progress (openai's client logs as httpx2)
        logging.getLogger(name).setLevel(logging.WARNING)
    started = time.monotonic()
    try:
        with devices.for_job(gpus):
            main()
    except USER_ERRORS as err:
        logging.getLogger("draftsmith").error("%s", err, exc_info=True)
        print(f"draftsmith: {type(err).__name__}: {err} (log: {log_path})", file=console)
        sys.exit(1)
    except BaseException:
        logging.getLogger("draftsmith").exception("unexpected error")
        raise
    finally:
        with contextlib.suppress(OSError):  # a ledger that cannot be written never fails the job
            spent.add(log_path, time.monotonic() - started)
