import asyncio
import json
import logging
import random
import shutil
from pathlib import Path

from draftsmith.config import target
from draftsmith.core import compute
from draftsmith.core.atomic import write_json, write_text
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.generation import vllm_fixes
from draftsmith.generation.generate import answer_sampling, model_sampling
from draftsmith.generation.server import managed_server
from draftsmith.ops.runner import base_dir, run, target_of
from draftsmith.training import export as ex
from draftsmith.training import families, replay

log = logging.getLogger("draftsmith.training.export")
PER_REQUEST = "--per-request-spec-decode-metrics"  # vLLM's counts per request in each response (0.32 on)


def failed(checkpoint: Path, reason: str, epoch: int) -> None:
    """A family whose export or gate failed: its checkpoint as speculators saved it, and the verdict, so
    the other families' pick stands and the report names why this one is left out."""
    for source, dest in ((checkpoint / "model.safetensors", sm.output.weights),
                         (checkpoint / "config.json", sm.output.config)):
        shutil.copyfile(source, dest)
    write_json(sm.output.gate, {"passed": False, "served": None, "verdict": reason, "epoch": epoch})
    log.error("%s: left out of the pick: %s", sm.wildcards.family, reason)


def predicted_at_gate(checkpoint: Path, tgt, rows: int, skip: set, stores: dict, k: int,
                      samplings: dict) -> tuple[dict | None, str | None]:
    """What the gate's server should accept, by position: the exported checkpoint replayed on the same validation
    rows, first turns and window (draftsmith.training.replay); else None and why (online hidden states: none
    stored to replay on; the replay failed or had no rows)."""
    if not stores:
        return None, replay.ONLINE
    return replay.at_gate(checkpoint, Path(sm.input.table), stores, skip, Path(tgt.model), rows, k, ex.GATE_WINDOW,
                          compute.device(), samplings)


def main() -> None:
    family = sm.wildcards.family
    summary = json.loads(Path(sm.input.summary).read_text())
    checkpoint, tgt = Path(summary["checkpoint"]), target_of(sm)
    epoch = summary["chosen"]["epoch"]
    model = tgt.model
    drafter = Path(sm.output.weights).parent
    sglang = sm.params.export["sglang"]
    checkpoint_config = json.loads((checkpoint / "config.json").read_text())
    why_not = ex.sglang_refusal(checkpoint_config)
    if sglang is True or (sglang == "auto" and not why_not):
        ex.export_sglang(checkpoint, Path(sm.output.sglang))
    else:
        reason = "export.sglang is false" if sglang is False else f"not exported: {why_not}"
        Path(sm.output.sglang).mkdir(parents=True, exist_ok=True)
        write_text(Path(sm.output.sglang) / "NOT_EXPORTED.txt", reason + "\n")
        log.warning("SGLang: %s", reason)
    try:
        ex.export_vllm(checkpoint, Path(sm.output.weights), Path(sm.output.config),
                       verifier_ref=target.verifier_reference(tgt, sm.params.base_model, base_dir(sm)))
    except (ex.ExportRefused, ValueError) as err:
        failed(checkpoint, f"not exported for vLLM: {err}", epoch)
        return
    on_gpus = sm.resources.gpu > 0
    unserved = families.not_served_here(family, on_gpus=on_gpus) or vllm_fixes.unserved_here(
        family, checkpoint_config, on_gpus)
    if unserved:  # exported and checked, but the gate needs a machine that serves it
        write_json(sm.output.gate, {"passed": None, "served": False, "verdict": unserved, "epoch": epoch})
        log.warning("gate: %s", unserved)
        return
    chosen = next((v for v in summary["validation"] if v["epoch"] == epoch), {})
    expected = families.first_position_accuracy(chosen)
    stores, left_out = replay.open_stores(sm.input.manifests)  # rows whose extraction failed: not gated either
    # served as generated (read here: no param, nothing retrained)
    samplings = answer_sampling(sm.config["datasets"], model_sampling(model, tgt.revision))
    any_sampled = any(replay.sampled(s) for s in samplings.values())
    gate_cfg = sm.config["export"]
    rows = ex.gate_rows(Path(sm.input.table), ex.gate_size(gate_cfg.get("gate_prompts"), any_sampled), samplings,
                        skip=left_out)
    samples = ex.gate_samples(len(rows), gate_cfg.get("gate_samples"), any_sampled)
    seed = random.SystemRandom().randrange(2**31) if any_sampled else None  # this gate run's own draws
    requests, of_row = ex.gate_requests(rows, samples, seed or 0)
    name, k = ev.drafted_per_step(str(drafter), ex.GATE_CHAIN)
    started, served = {}, {}
    spec = ev.server_spec("vllm", tgt, sm.config["server"], name, k, str(drafter))
    if not any(arg.startswith(PER_REQUEST) for arg in spec.extra_args):  # each row's counts, for the band over rows
        spec.extra_args += [PER_REQUEST, "summary"]

    def serve() -> None:
        # its start retried for the machine's failures, which fail the job, never the family (ev.serving)
        with ev.serving(lambda: managed_server(spec, Path(sm.log.server)), started) as server:
            root = ev.root_of(server.base_url)
            before = ev.scrape_spec_counters(root)
            responses = asyncio.run(ev.continue_rows(server.base_url, model, requests, 2))
            served["acceptance"] = ev.acceptance(before, ev.scrape_spec_counters(root))
            served["per_row"] = ex.served_rows(responses, of_row, len(rows))

    try:
        killed = ev.killed_every_try(serve, f"the {family} gate")
    except ev.SERVING_FAILURES as err:  # refused at start (DSpark on vLLM's V1 runner) or died drafting
        ev.raise_unless_the_methods(err, f"the {family} gate", ev.exit_code(started.get("server")))
        killed = ev.failure_of(err)
    if killed:
        failed(checkpoint, f"vLLM did not serve the drafter: {killed} (log: {sm.log.server})", epoch)
        return
    acceptance = served["acceptance"]
    predicted, why_not = predicted_at_gate(checkpoint, tgt, len(rows), left_out, stores, k, samplings)
    passed, verdict, positions, resolution = ex.gate_verdict(acceptance, expected, predicted=predicted,
                                                             served_per_row=served["per_row"], samples=samples,
                                                             seed=seed)
    write_json(sm.output.gate, {"passed": passed, "served": True, "verdict": verdict, "acceptance": acceptance,
                                "predicted": predicted, "predicted_missing": why_not, "positions": positions,
                                "validation_first_token_accuracy": expected, "epoch": epoch,
                                "validation_rows": len(rows), "window": ex.GATE_WINDOW, "samples": samples,
                                "thresholds": ex.flag_thresholds(),
                                "seed": seed, "served_per_row": served["per_row"], "resolution": resolution})
    (log.info if passed else log.error)("gate: %s%s", verdict, "" if passed else "; left out of the pick")


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
