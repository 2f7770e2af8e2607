import asyncio
import json
import logging
import shutil
from pathlib import Path


from draftsmith import hidden_states as hs
from draftsmith.runner import run
from draftsmith.server import managed_server, spec_from_config

log = logging.getLogger("draftsmith.hidden_states")


def main() -> None:
    cfg, model = sm.params.hidden_states, sm.params.model
    folder = Path(sm.output.manifest).parent
    target = json.loads((Path(model) / "config.json").read_text())
    num_layers, hidden = target["num_hidden_layers"], target["hidden_size"]
    aux = cfg["aux_layers"] or hs.default_aux_layers(num_layers)
    todo, total = hs.rows_to_extract(Path(sm.input.table), folder)
    log.info("%d of %d rows need hidden states (layers %s + final %d)", len(todo), total, aux, num_layers)
    hs.check_disk(folder, hs.estimate_bytes(sum(len(t) for _, t in todo), len(aux) + 1, hidden))
    if todo and cfg["backend"] == "transformers":
        hs.extract_transformers(model, todo, folder, aux, sm.threads)
    elif todo:
        staging = folder / ".staging"
        shutil.rmtree(staging, ignore_errors=True)  # files a killed run staged but never validated
        spec = spec_from_config(model, sm.params.server, **hs.vllm_server_configs(aux, num_layers, staging))
        with managed_server(spec, Path(sm.log.server)) as base_url:
            asyncio.run(hs.extract_vllm(base_url, todo, folder, cfg["concurrency"], cfg["request_timeout_s"],
                                        cfg["max_retries"]))
    manifest = hs.write_manifest(folder, Path(sm.output.manifest), cfg["backend"], aux, num_layers, hidden,
                                 Path(sm.input.table))
    log.info("%s", manifest)


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log.main, sm.threads)
