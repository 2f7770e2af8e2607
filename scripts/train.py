import json
import logging
from pathlib import Path

import pyarrow.parquet as pq

from draftsmith import train as tr
from draftsmith.atomic import write_json
from draftsmith.runner import run

log = logging.getLogger("draftsmith.train")


def main() -> None:
    cfg, model = sm.params.train, sm.params.model
    manifests = {Path(m).parent.name: json.loads(Path(m).read_text()) for m in sm.input.manifests}
    aux_layers = next(iter(manifests.values()))["aux_layers"]
    key = tr.run_key({"train": cfg, "data": tr.file_digest(Path(sm.input.table)),
                      "d2t": tr.file_digest(Path(sm.input.d2t)), "manifests": manifests})
    run_dir = Path(sm.params.runs_dir) / key
    data_dir = run_dir / "data"
    if not data_dir.exists():
        tr.assemble_training_dir(Path(sm.input.table), {n: Path(m).parent for n, m in
                                                        zip(manifests, sm.input.manifests, strict=True)}, data_dir)
    on_cpu = tr.adapt_for_cpu()
    rows = pq.read_metadata(sm.input.table).num_rows
    argv = tr.speculators_args(cfg, verifier=model, data_dir=data_dir, save_dir=run_dir / "checkpoints",
                               d2t=Path(sm.input.d2t), t2d=Path(sm.input.t2d), aux_layers=aux_layers,
                               train_ratio=1 - sm.params.validation_fraction, on_cpu=on_cpu,
                               log_dir=run_dir / "logs")
    log.info("run %s (%d rows, cpu=%s): speculators train %s", key, rows, on_cpu, " ".join(argv))
    validation = tr.train(argv, run_dir / "validation.jsonl")
    checkpoint = tr.latest_checkpoint(run_dir / "checkpoints")
    tr.export(checkpoint, Path(sm.output.weights), Path(sm.output.config), verifier_ref=model)
    write_json(sm.output.summary, {"run_key": key, "checkpoint": str(checkpoint), "rows": rows, "on_cpu": on_cpu,
                                   "speculators_argv": argv, "validation": validation})


if __name__ == "__main__":  # dataloader workers re-import this file without `snakemake`
    sm = snakemake  # noqa: F821 - injected by Snakemake
    run(main, sm.log[0], sm.threads)
