import json
import logging
import subprocess
from contextlib import nullcontext
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith import hidden_states as hs
from draftsmith import target
from draftsmith import train as tr
from draftsmith.atomic import write_json
from draftsmith.digest import file_sha256, json_digest
from draftsmith.hs_store import BACKEND, fingerprint, open_store, write_locations
from draftsmith.merge import train_ratio, train_rows
from draftsmith.runner import run, target_of
from draftsmith.server import managed_server, spec_from_config

log = logging.getLogger("draftsmith.train")


def stores(manifest_paths):
    """Each dataset's hidden-state store, as its manifest describes it; shards verified."""
    out = {}
    for path in map(Path, manifest_paths):
        manifest = json.loads(path.read_text())
        store = open_store(path.parent, manifest["fingerprint"], manifest["layout"])
        if manifest["layout"] == "shards":
            store.verify(full=sm.config["hidden_states"]["verify"] == "sha256")
        out[path.parent.name] = store
    return out


def main() -> None:
    cfg, hs_cfg, ops = sm.params.train, sm.params.hidden_states, sm.config["train"]
    tgt = target_of(sm)
    facts = target.facts(tgt)
    merged = Path(sm.input.table)
    pretrained = Path(sm.input.pretrained[0]).parent if sm.input.pretrained else None
    aux = hs.choose_aux_layers(hs_cfg["aux_layers"], facts.num_layers,
                               pretrained / "check.json" if pretrained else None)
    online = hs_cfg["mode"] == "online"
    states = fingerprint(target.fingerprint(tgt), aux, facts.num_layers, "vllm" if online else hs_cfg["backend"])
    key = json_digest({"train": cfg, "data": file_sha256(merged), "d2t": file_sha256(Path(sm.input.d2t)),
                      "hidden_states": [hs_cfg["mode"], states], "pretrained": pretrained and json.loads(
                          (pretrained / "check.json").read_text())}, 12)
    run_dir = Path(sm.params.runs_dir) / key
    data_dir = run_dir / "data"
    if not data_dir.exists():
        tr.write_dataset(merged, data_dir)
    if not online:
        by_dataset = stores(sm.input.manifests)
        table = pq.read_table(merged, columns=["dataset", "source_row"])
        write_locations(data_dir, [by_dataset[d].locations([r])[0] for d, r in
                                   zip(table.column("dataset").to_pylist(), table.column("source_row").to_pylist(),
                                       strict=True)])
    on_cpu = tr.adapt_for_cpu()
    rows = pq.read_metadata(merged).num_rows
    server = spec_from_config(tgt.model, sm.config["server"], **hs.vllm_server_configs(
        aux, facts.num_layers, run_dir / "online_staging")) if online else None
    with managed_server(server, Path(sm.log.server)) if online else nullcontext() as extractor:
        argv = tr.speculators_args(
            cfg, verifier=tgt.model, data_dir=data_dir, save_dir=run_dir / "checkpoints", d2t=Path(sm.input.d2t),
            t2d=Path(sm.input.t2d), aux_layers=aux, train_ratio=train_ratio(train_rows(merged), rows), on_cpu=on_cpu,
            log_dir=run_dir / "logs", num_workers=ops["num_workers"], from_pretrained=pretrained,
            hidden_states_backend="file" if online else BACKEND,
            vllm_endpoint=extractor.base_url if online else None)
        log.info("run %s (%d rows, %s hidden states, cpu=%s): speculators train %s", key, rows, hs_cfg["mode"],
                 on_cpu, " ".join(argv))
        metrics = run_dir / "validation.jsonl"
        if ops["gpus"] > 1:
            subprocess.run(tr.torchrun_command(ops["gpus"], metrics, argv), check=True)
            validation = tr.read_validation(metrics)
        else:
            validation = tr.train(argv, metrics)
    for epoch in validation:
        epoch["simulated_tau"] = tr.simulated_tau(epoch)
    checkpoint, choice = tr.choose_checkpoint(run_dir / "checkpoints", validation) if cfg["select"] == "tau" else \
        tr.choose_checkpoint(run_dir / "checkpoints", validation[-1:])
    split = pq.read_table(merged, columns=["seq_len", "split"]).to_pylist()
    trained_tokens = cfg["epochs"] * sum(r["seq_len"] for r in split if r["split"] == "train")
    write_json(sm.output.summary, {
        "run_key": key, "checkpoint": str(checkpoint), "chosen": choice, "rows": rows, "on_cpu": on_cpu,
        "trained_tokens": trained_tokens,
        "hidden_states": {"mode": hs_cfg["mode"], "layout": None if online else hs_cfg["layout"], "aux_layers": aux},
        "warm_start": json.loads((pretrained / "check.json").read_text()) if pretrained else None,
        "speculators_argv": argv, "validation": validation})
    log.info("exporting epoch %s: %s", choice["epoch"], choice["reason"])


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake
    run(main, sm.log.main, sm.threads)
