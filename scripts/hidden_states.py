import asyncio
import logging
from pathlib import Path

from draftsmith.config import target
from draftsmith.config.layers import choose_aux_layers
from draftsmith.core import compute
from draftsmith.core.units import human_bytes
from draftsmith.generation.server import managed_server, spec_from_config
from draftsmith.hidden_states import extract as hs
from draftsmith.hidden_states.store import fingerprint, open_store
from draftsmith.ops.plan import bytes_per_token
from draftsmith.ops.runner import run, target_of

log = logging.getLogger("draftsmith.hidden_states.extract")


def main() -> None:
    cfg, ops = sm.params.hidden_states, sm.config["hidden_states"]
    tgt = target_of(sm)
    facts = target.facts(tgt)
    folder = Path(sm.output.manifest).parent
    aux = choose_aux_layers(cfg["aux_layers"], facts.num_layers,
                               Path(sm.input.pretrained[0]) if sm.input.pretrained else None)
    store = open_store(folder, fingerprint(target.fingerprint(tgt), aux, facts.num_layers, cfg["backend"],
                                           cfg["storage"]), cfg["layout"], cfg["shard_mb"], cfg["storage"])
    freed = store.purge_stale()
    if freed:
        log.info("deleted %s of hidden states made with other settings", human_bytes(freed))
    if store.layout == "shards":
        for path in store.drop_damaged(full=ops["verify"] == "checksum"):
            log.warning("%s is damaged (size or checksum); its rows are extracted again", path)
    rows = hs.read_rows(Path(sm.input.table))
    done = store.done(rows)
    todo = [(i, ids) for i, ids in enumerate(rows) if i not in done]
    log.info("%d of %d rows need hidden states (layers %s + final %d, %s layout)", len(todo), len(rows), aux,
             facts.num_layers, store.layout)
    per_token = bytes_per_token(facts.hidden_size, len(aux) + 1)  # as the server stages a row: bf16
    stored = bytes_per_token(facts.hidden_size, len(aux) + 1, cfg["storage"])
    hs.check_disk(folder, stored * sum(len(t) for _, t in todo))
    dtype = compute.choose(sm.config["server"]["dtype"])
    failed: dict[int, str] = {}
    if todo and cfg["backend"] == "transformers":
        with store.writer() as writer:
            hs.extract_transformers(tgt.model, todo, writer, aux, sm.threads, dtype.dtype,
                                    trust_remote_code=tgt.trust_remote_code, batch_tokens=ops["batch_tokens"])
    elif todo:
        staged = 2 if dtype.dtype == "float32" else 1  # the server's file holds what it computed in
        staging = hs.staging_folder(ops["staging_dir"], folder, sm.wildcards.dataset)
        spec = spec_from_config(tgt, sm.config["server"],
                                **hs.vllm_server_configs(aux, facts.num_layers, staging))
        with managed_server(spec, Path(sm.log.server)) as server, store.writer() as writer:
            failed = asyncio.run(hs.extract_vllm(server.base_url, todo, writer, hs.ExtractionPolicy.from_config(ops),
                                                 lambda tokens: tokens * per_token * staged))
    hs.check_failures(failed, len(rows), ops["max_error_fraction"], folder / "failures.json")
    manifest = hs.write_manifest(store, rows, Path(sm.output.manifest), failed, backend=cfg["backend"],
                                 aux_layers=aux, final_layer=facts.num_layers, hidden_size=facts.hidden_size,
                                 storage=cfg["storage"],
                                 compute=dtype.as_dict())
    log.info("%s", {k: v for k, v in manifest.items() if k != "shards"})


if __name__ == "__main__":
    sm = snakemake
    run(main, sm.log.main, sm.threads, sm.resources.gpu)
