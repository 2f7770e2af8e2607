import json
import logging
import os
import time
from contextlib import nullcontext
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith.config import target
from draftsmith.config.layers import choose_aux_layers
from draftsmith.core import compute
from draftsmith.core.atomic import write_json
from draftsmith.core.digest import file_sha256, json_digest
from draftsmith.data.merge import TRAIN, train_ratio
from draftsmith.generation.generate import answer_sampling, model_sampling
from draftsmith.generation.server import managed_server, spec_from_config
from draftsmith.hidden_states import extract as hs
from draftsmith.hidden_states.store import BACKEND, fingerprint, write_locations
from draftsmith.ops.runner import run, target_of
from draftsmith.training import families, placement, probe, replay
from draftsmith.training import speculators_patches as patches
from draftsmith.training import train as tr

log = logging.getLogger("draftsmith.training.train")


def main() -> None:
    started = time.time()
    cfg, hs_cfg, ops = sm.params.train, sm.params.hidden_states, sm.config["train"]
    online = hs_cfg["mode"] == "online"
    if online:  # first: nothing may start CUDA or torch's threads before the trainer's share is set
        shares = placement.online(sm.config["server"]["gpus"], ops["gpus"], sm.threads,
                                 os.environ.get("CUDA_VISIBLE_DEVICES"))
        placement.apply_to_trainer(shares)
        log.info("online hidden states: %s", shares.summary)
    family = sm.wildcards.family
    tgt = target_of(sm)
    facts = target.facts(tgt)
    merged = Path(sm.input.table)
    pretrained = Path(sm.input.pretrained[0]).parent if sm.input.pretrained else None
    aux = choose_aux_layers(hs_cfg["aux_layers"], facts.num_layers,
                               pretrained / "check.json" if pretrained else None)
    states = fingerprint(target.fingerprint(tgt), aux, facts.num_layers, "vllm" if online else hs_cfg["backend"],
                         "bf16" if online else hs_cfg["storage"])
    by_dataset, failed = replay.open_stores(sm.input.manifests, sm.config["hidden_states"]["verify"]) \
        if not online else ({}, set())
    table = pq.read_table(merged, columns=["dataset", "source_row", "split", "seq_len"]).to_pylist()
    keep = [i for i, r in enumerate(table) if (r["dataset"], r["source_row"]) not in failed]
    if len(keep) < len(table):
        log.warning("%d merged rows have no hidden states (failed extraction) and are left out", len(table) - len(keep))
    mask = tr.choose_mask_token(cfg["mask_token_id"], target.load_tokenizer(tgt), facts.vocab_size,
                                lambda: tr.token_ids(merged)) if family != families.DEFAULT_FAMILY else None
    if mask:
        log.info("%s mask token: id %d, %s", family, *mask)
    key = json_digest({"train": cfg, **({"mask_token_id": mask[0]} if mask else {}), "data": file_sha256(merged),
                       "d2t": file_sha256(Path(sm.input.d2t)),
                       "left_out": sorted(failed), "hidden_states": [hs_cfg["mode"], states],
                       "pretrained": pretrained and json.loads((pretrained / "check.json").read_text())}, 12)
    run_dir = Path(sm.params.runs_dir) / key
    if tr.adopt_earlier_run(Path(sm.params.runs_dir), key, family):
        log.info("run %s was made before drafter families: its checkpoints moved to %s and resume", key, run_dir)
    data_dir = run_dir / "data"
    if not data_dir.exists():
        tr.write_dataset(merged, data_dir, keep)
    if not online:
        write_locations(data_dir, [by_dataset[table[i]["dataset"]].locations([table[i]["source_row"]])[0]
                                   for i in keep])
    on_cpu = patches.adapt_for_cpu()
    device = compute.device()
    dtype = compute.choose(ops["dtype"], training=True)
    trainer = probe.choose(ops, cfg, device)
    rows = len(keep)
    n_train = sum(table[i]["split"] == TRAIN for i in keep)
    server = spec_from_config(tgt, sm.config["server"], **hs.vllm_server_configs(
        aux, facts.num_layers, run_dir / "online_staging")) if online else None
    if server:
        server.env = {**shares.server_env, **server.env}  # a binding the config sets wins
    def speculators_argv(endpoint: str | None) -> list[str]:
        return tr.speculators_args(
            cfg, verifier=tgt.model, data_dir=data_dir, save_dir=run_dir / "checkpoints", d2t=Path(sm.input.d2t),
            t2d=Path(sm.input.t2d), aux_layers=aux, train_ratio=train_ratio(n_train, rows), device=device,
            log_dir=run_dir / "logs", num_workers=ops["num_workers"], from_pretrained=pretrained,
            hidden_states_backend="file" if online else BACKEND, vllm_endpoint=endpoint, dtype=dtype.dtype,
            trust_remote_code=tgt.trust_remote_code, loss_implementation=trainer.loss_implementation,
            compile_=trainer.compile, mask_token_id=mask and mask[0])

    metrics = run_dir / "validation.jsonl"
    validation = tr.finished(metrics, run_dir / "checkpoints", cfg["epochs"])
    if validation is not None:  # this job again (a rerun of its rule): no trainer, and no target served online
        log.info("%s run %s trained every epoch already: nothing to train", family, key)
        argv = speculators_argv(None)
    else:
        with managed_server(server, Path(sm.log.server)) if online else nullcontext() as extractor:
            argv = speculators_argv(extractor.base_url if online else None)
            log.info("%s run %s (%d rows, %s hidden states, cpu=%s, %s: %s): speculators train %s", family, key,
                     rows, hs_cfg["mode"], on_cpu, dtype.dtype, dtype.reason, " ".join(argv))
            processes = ops["processes"] or max(ops["gpus"], 1)
            if processes > 1:
                threads = shares.trainer_threads if online and shares.trainer_threads else sm.threads
                validation = tr.train_under_torchrun(processes, metrics, argv, threads)
            else:
                validation = tr.train(argv, metrics)
    phases = json.loads(tr.phases_file(metrics).read_text())
    for epoch in validation:
        epoch["simulated_tau"] = tr.simulated_tau(epoch)
    if not online:  # what a server would accept, by epoch, at the draft lengths EAGLE-3 is served at (read here,
        # not a param: the trained checkpoints do not depend on them; a block family drafts its block)
        replay.predict_epochs(validation, tr.epoch_checkpoints(run_dir / "checkpoints"), merged, by_dataset, failed,
                              Path(tgt.model), sorted(sm.config["evaluation"]["num_speculative_tokens"]), device,
                              answer_sampling(sm.config["datasets"], model_sampling(tgt.model, tgt.revision)))
    else:
        replay.skipped(validation, replay.ONLINE)
    checkpoint, choice = tr.choose_checkpoint(run_dir / "checkpoints", validation) if cfg["select"] == "tau" else \
        tr.choose_checkpoint(run_dir / "checkpoints", validation[-1:])
    trained_tokens = cfg["epochs"] * sum(table[i]["seq_len"] for i in keep if table[i]["split"] == TRAIN)
    write_json(sm.output.summary, {
        "family": family, "mask_token": mask and {"id": mask[0], "why": mask[1]}, "run_key": key,
        "checkpoint": str(checkpoint), "chosen": choice, "rows": rows, "on_cpu": on_cpu,
        "rows_without_hidden_states": len(table) - len(keep), "compute": dtype.as_dict(),
        "trained_tokens": trained_tokens,
        "hidden_states": {"mode": hs_cfg["mode"], "layout": None if online else hs_cfg["layout"],
                          "storage": None if online else hs_cfg["storage"], "aux_layers": aux},
        "warm_start": json.loads((pretrained / "check.json").read_text()) if pretrained else None,
        "trainer": trainer.as_dict(), "phases": phases, "window": [started, time.time()],
        "speculators_argv": argv, "validation": validation})
    log.info("exporting epoch %s: %s", choice["epoch"] + 1, choice["reason"])  # 1-based, as the card and report say


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
