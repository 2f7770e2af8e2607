"""The preflight (rule preflight), an ancient() input of every expensive job: the config against the prepared
target, then the engine check for the families configured now (draftsmith.ops.engine_check), so that on every
executor no generation, extraction or training starts before vLLM is known to serve the target with each
drafter family. Once per target: a rerun on config changes would, through ancient(), hide the reruns it
should cause downstream; a family added later is checked by rule engine_check, before the pick."""

import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.core.atomic import write_json
from draftsmith.ops import devices, engine_check, preflight
from draftsmith.ops.runner import base_dir, run, target_of


def main() -> None:
    tgt = target_of(sm)
    facts = target.facts(tgt)
    preflight.check(sm.config, tgt, base_dir(sm), facts)
    notices = preflight.notices(sm.config, base_dir(sm))
    for notice in notices:
        logging.getLogger("draftsmith.ops.preflight").warning("%s", notice)
    server = sm.config["server"]
    engine = {"skipped": "server.engine_check is false"} if not server["engine_check"] else engine_check.run(
        tgt, list(sm.config["train"]["families"]), server, engine_check.drafter_shapes(sm.config["train"]),
        Path(sm.output[0]).parent / "engine", Path(sm.log[0]).with_suffix(""))
    write_json(sm.output[0], {"target": tgt.name, "facts": facts.__dict__, "problems": [], "notices": notices,
                              "nvidia_driver": devices.driver_version(), "engine": engine})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0], sm.threads, sm.resources.gpu)
