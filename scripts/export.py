import asyncio
import json
import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.core.atomic import write_json, write_text
from draftsmith.evaluation import evaluate as ev
from draftsmith.generation.server import managed_server
from draftsmith.ops.runner import base_dir, run, target_of
from draftsmith.training import export as ex
from draftsmith.training import families

log = logging.getLogger("draftsmith.training.export")


GATE_CHAIN = 3  # EAGLE-3's drafts per step at the gate (a block family drafts its trained block)


class GateFailed(ValueError):
    pass


def main() -> None:
    family = sm.wildcards.family
    summary = json.loads(Path(sm.input.summary).read_text())
    checkpoint, tgt = Path(summary["checkpoint"]), target_of(sm)
    model = tgt.model
    drafter = Path(sm.output.weights).parent
    ex.export_vllm(checkpoint, Path(sm.output.weights), Path(sm.output.config),
                   verifier_ref=target.verifier_reference(tgt, sm.params.base_model, base_dir(sm)))
    sglang = sm.params.export["sglang"]
    why_not = ex.sglang_refusal(json.loads((checkpoint / "config.json").read_text()))
    if sglang is True or (sglang == "auto" and not why_not):
        ex.export_sglang(checkpoint, Path(sm.output.sglang))
    else:
        reason = "export.sglang is false" if sglang is False else f"not exported: {why_not}"
        Path(sm.output.sglang).mkdir(parents=True, exist_ok=True)
        write_text(Path(sm.output.sglang) / "NOT_EXPORTED.txt", reason + "\n")
        log.warning("SGLang: %s", reason)
    unserved = families.not_served_here(family, on_gpus=sm.resources.gpu > 0)
    if unserved:  # exported and checked, but the gate needs a machine that serves it
        write_json(sm.output.gate, {"passed": None, "served": False, "verdict": unserved,
                                    "epoch": summary["chosen"]["epoch"]})
        log.warning("gate: %s", unserved)
        return
    chosen = next((v for v in summary["validation"] if v["epoch"] == summary["chosen"]["epoch"]), {})
    expected = families.first_position_accuracy(chosen)
    rows = ex.gate_rows(Path(sm.input.table), sm.config["export"]["gate_prompts"])
    with managed_server(ev.server_spec("vllm", tgt, sm.config["server"], str(drafter), GATE_CHAIN),
                        Path(sm.log.server)) as server:
        root = ev.root_of(server.base_url)
        before = ev.scrape_spec_counters(root)
        asyncio.run(ev.continue_tokens(server.base_url, model, rows, 2))
        acceptance = ev.acceptance(before, ev.scrape_spec_counters(root))
    passed, verdict = ex.gate_verdict(acceptance, expected)
    write_json(sm.output.gate, {"passed": passed, "served": True, "verdict": verdict, "acceptance": acceptance,
                                "validation_first_token_accuracy": expected, "epoch": summary["chosen"]["epoch"],
                                "validation_rows": len(rows)})
    log.info("gate: %s", verdict)
    if not passed:
        raise GateFailed(f"export gate: {verdict}")


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
