"""The engine check before any work (draftsmith.ops.engine_check; rule engine_check in rules/model.smk): vLLM
started on a weightless twin of the target with a random drafter of each configured family. A family the
engine cannot serve fails the job, naming it, the server's key error line and what to do, before hours of
generation and training; ``server.engine_check: false`` writes a skipped verdict and starts nothing. The
twin and the drafters are kept in ``results/checks/engine/``."""

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
