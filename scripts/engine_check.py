"""The engine check (draftsmith.ops.engine_check): vLLM started on a weightless twin of the target with a random
drafter of each configured family. The preflight makes it before any work, for the families configured then
(engine_check.before_work); this job, read by the pick, reuses those verdicts and checks only a family added
(or reshaped) since. A
family the engine cannot serve fails the job, naming it, the server's key error line and what to do;
``server.engine_check: false`` writes a skipped verdict and starts nothing. The twin and the drafters are
kept in ``results/checks/engine/``."""

import logging
from pathlib import Path

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
    write_json(out, engine_check.run(target_of(sm), list(sm.params.families), server, dict(sm.params.shapes),
                                     engine_check.WORK, Path(sm.log[0]).with_suffix(""),
                                     engine_check.earlier_verdicts()))


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0], sm.threads, sm.resources.gpu)
