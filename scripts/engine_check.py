"""The engine check before any work (draftsmith.ops.engine_check): vLLM started on a weightless twin of the
target with a random drafter of each configured family. A family the engine cannot serve fails the job,
naming it, the server's key error line and what to do, before hours of generation and training.

The rule this adapter expects (beside ``preflight``; the first expensive jobs should take its output as an
input, so nothing starts before it passes):

    rule engine_check:
        input:
            model=target_input,                                  # the target's folder (none for a hub id)
        output:
            "results/checks/engine.json",                        # {family: {served, seconds, drafts, error, log}}
        log:
            main="logs/engine_check.log",                        # servers: logs/engine_check/<family>.server.log
        params:
            families=config["train"]["families"],
            shapes=engine_check.drafter_shapes(config["train"]),  # from draftsmith.ops import engine_check
            server=RESULT["server"],                             # the engine's flags: reruns when they change
        threads: config["server"]["threads"]
        resources:
            gpu=config["server"]["gpus"],
            tasks_per_gpu=ONE_TASK_PER_JOB,
            mem_mb=config["server"]["mem_mb"],
            runtime=server_runtime(5 * len(config["train"]["families"]), servers=len(config["train"]["families"])),
        script:
            "../scripts/engine_check.py"

It reads the full ``server`` section from ``sm.config`` (startup timeout, GPUs: operational settings that
must not rerun it) and ``server.engine_check`` (proposed: boolean, default true, x-operational): false
writes a skipped verdict and starts nothing. The twin and the random drafters are kept in
``results/checks/engine/`` beside the output.
"""

import json
import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.core.atomic import write_json
from draftsmith.ops import engine_check
from draftsmith.ops.runner import run, target_of

log = logging.getLogger("draftsmith.ops.engine_check")


def main() -> None:
    server = sm.config["server"]
    out = Path(sm.output[0])
    if not server.get("engine_check", True):
        write_json(out, {"skipped": "server.engine_check is false"})
        log.warning("engine check skipped (server.engine_check: false)")
        return
    tgt = target_of(sm)
    config = target.config_path(tgt)
    if config is None:
        target.load_config(tgt)  # raises FileNotFoundError saying where the config was looked for
    log_dir = Path(sm.log[0]).with_suffix("")
    results = engine_check.check(config.parent, list(sm.params.families), server, out.parent / "engine", log_dir,
                                 trust_remote_code=tgt.trust_remote_code, shapes=dict(sm.params.shapes))
    log.info("engine check: %s", json.dumps(results))
    failure = engine_check.failure_message(results, tgt.name, on_gpus=server["gpus"] > 0)
    if failure:
        raise ValueError(failure)
    write_json(out, results)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0], sm.threads, sm.resources.gpu)
