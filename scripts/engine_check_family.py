"""One family's engine check before its training (rule engine_check_family, draftsmith.ops.engine_check): the
preflight's verdict where it checked the family with the same shape and server settings before any work, else
vLLM started on the target's weightless twin with a random drafter of the family. A family the engine cannot
serve fails the job, naming it and what to do, and its training never starts; ``server.engine_check: false``
writes a skipped verdict. A new verdict joins the preflight's (engine_check.BEFORE_WORK), where the check the pick
reads finds it and starts no second server for it. Everything comes from the config, nothing from params: this
job must not rerun for a family already trained (see the rule), so keep this file as it is."""

import fcntl
import logging
from pathlib import Path

from draftsmith.core.atomic import write_json
from draftsmith.ops import engine_check
from draftsmith.ops.runner import run, target_of

log = logging.getLogger("draftsmith.ops.engine_check")


def keep(verdicts: dict) -> None:
    """Add ``verdicts`` to the ones made before work, under a lock (families are checked in parallel jobs)."""
    engine_check.BEFORE_WORK.parent.mkdir(parents=True, exist_ok=True)
    with open(engine_check.BEFORE_WORK.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        write_json(engine_check.BEFORE_WORK, {**(engine_check.earlier_verdicts() or {}), **verdicts})


def main() -> None:
    server, family, out = sm.config["server"], sm.wildcards.family, Path(sm.output[0])
    if not server.get("engine_check", True):
        write_json(out, {"skipped": "server.engine_check is false"})
        log.warning("engine check of %s skipped (server.engine_check: false)", family)
        return
    earlier = engine_check.earlier_verdicts()
    verdicts = engine_check.run(target_of(sm), [family], server, engine_check.drafter_shapes(sm.config["train"]),
                                engine_check.WORK, Path(sm.log[0]).with_suffix(""), earlier)
    if (earlier or {}).get(family) != verdicts[family]:
        keep(verdicts)
    write_json(out, verdicts)


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0], sm.threads, sm.resources.gpu)
