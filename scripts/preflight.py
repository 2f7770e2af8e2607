import logging

from draftsmith.config import target
from draftsmith.core.atomic import write_json
from draftsmith.ops import devices, preflight
from draftsmith.ops.runner import base_dir, run, target_of


def main() -> None:
    tgt = target_of(sm)
    facts = target.facts(tgt)
    preflight.check(sm.config, tgt, base_dir(sm), facts)
    notices = preflight.notices(sm.config)
    for notice in notices:
        logging.getLogger("draftsmith.ops.preflight").warning("%s", notice)
    write_json(sm.output[0], {"target": tgt.name, "facts": facts.__dict__, "problems": [], "notices": notices,
                              "nvidia_driver": devices.driver_version()})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log[0])
