import json

import pytest
import torch
from safetensors.torch import save_file

from draftsmith import train as tr


def fake_checkpoint(folder, *, hidden=8, drop=None, fc_cols=None):
    folder.mkdir(parents=True)
    tensors = {"d2t": torch.zeros(4, dtype=torch.int64), "t2d": torch.zeros(16, dtype=torch.bool),
               "fc.weight": torch.zeros(hidden, fc_cols or 3 * hidden), "lm_head.weight": torch.zeros(4, hidden)}
    tensors.pop(drop, None)
    save_file(tensors, folder / "model.safetensors")
    config = {"transformer_layer_config": {"hidden_size": hidden},
              "speculators_config": {"verifier": {"name_or_path": "/home/someone/abs/path"}}}
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_export_makes_the_verifier_reference_portable(tmp_path):
    ckpt = fake_checkpoint(tmp_path / "runs" / "0")
    config = tr.export(tr.latest_checkpoint(tmp_path / "runs"), tmp_path / "d" / "final.safetensors",
                       tmp_path / "d" / "config.json", verifier_ref="results/models/t")
    assert config["speculators_config"]["verifier"]["name_or_path"] == "results/models/t"
    assert "/home/someone" not in (tmp_path / "d" / "config.json").read_text()
    assert (tmp_path / "d" / "final.safetensors").read_bytes() == (ckpt / "model.safetensors").read_bytes()


@pytest.mark.parametrize("drop, fc_cols, message", [
    ("d2t", None, "no 'd2t' tensor"), ("t2d", None, "no 't2d' tensor"), (None, 16, r"fc.weight is \[8, 16\]")])
def test_checkpoints_vllm_would_mis_map_are_refused(tmp_path, drop, fc_cols, message):
    ckpt = fake_checkpoint(tmp_path / "c", drop=drop, fc_cols=fc_cols)
    with pytest.raises(ValueError, match=message):
        tr.check_drafter(ckpt / "model.safetensors", ckpt / "config.json")


def test_cpu_arguments_and_layer_ids(tmp_path):
    cfg = {"num_layers": 1, "epochs": 2, "lr": 1e-4, "total_seq_len": 512, "ttt_steps": 3, "seed": 0,
           "num_workers": 1, "max_steps": None, "from_pretrained": None}
    argv = tr.speculators_args(cfg, verifier="results/models/t", data_dir=tmp_path, save_dir=tmp_path,
                               d2t=tmp_path / "d2t.npy", t2d=tmp_path / "t2d.npy", aux_layers=[2, 15, 27],
                               train_ratio=0.9, on_cpu=True, log_dir=tmp_path)
    i = argv.index("--target-layer-ids")
    assert argv[i + 1:i + 4] == ["2", "15", "27"]
    assert argv[argv.index("--loss-implementation") + 1] == "eager"
    assert argv[argv.index("--draft-attn-impl") + 1] == "sdpa"
    assert "--max-steps" not in argv and "--from-pretrained" not in argv
    gpu = tr.speculators_args({**cfg, "from_pretrained": "ckpt"}, verifier="v", data_dir=tmp_path, save_dir=tmp_path,
                              d2t=tmp_path, t2d=tmp_path, aux_layers=[2, 15, 27], train_ratio=0.9, on_cpu=False,
                              log_dir=tmp_path)
    assert "--loss-implementation" not in gpu and gpu[gpu.index("--from-pretrained") + 1] == "ckpt"


def test_cpu_adaptation_redirects_the_trainer():
    from speculators.train import checkpointer, trainer

    assert tr.adapt_for_cpu() is True  # this machine has no accelerator
    assert trainer.get_local_rank() == "cpu" and checkpointer.get_current_device() == "cpu"


def test_validation_metrics_survive_a_resume(tmp_path):
    import logging

    path = tmp_path / "validation.jsonl"
    collector = tr._ValidationMetrics(path)
    log = logging.getLogger("speculators.metrics.test")
    log.addHandler(collector)
    log.setLevel(logging.INFO)
    try:
        log.info({"val": {"loss_epoch": 3.0}, "epoch": 1})
        log.info({"train": {"loss": 9.0}})  # training steps are not validation
        log.info({"val": {"loss_epoch": 5.0}, "epoch": 0})
    finally:
        log.removeHandler(collector)
    with path.open("a") as fh:
        fh.write('{"epoch": 2, "loss_ep')  # cut by a kill
    assert tr.read_validation(path) == [{"epoch": 0, "loss_epoch": 5.0}, {"epoch": 1, "loss_epoch": 3.0}]
