"""The decisions a job takes only on a CUDA GPU, called with ``cuda`` on this CPU for every family: the
trainer's probe and its arguments, the draft attention with compilation on and off. Only executing them
needs a GPU (benchmarks/gpu_check.sh); what they decide is tested here."""

import subprocess

import pytest

from draftsmith.core import platform
from draftsmith.training import families, probe
from draftsmith.training import train as tr
from tests.test_families import train_view

AUTO = {"loss_implementation": "auto", "compile": "auto"}
FAMILIES = ("eagle3", "dflash", "dspark")


def resolve(argv):
    from speculators.train.config import TrainConfig

    import draftsmith.hidden_states.store  # noqa: F401 - registers the backend

    return TrainConfig.resolve([a for a in argv if a not in tr.OWN_FLAGS]).flatten()


def trainer_argv(tmp_path, family, device, compiled):
    cfg = families.settings(train_view(families=[family]), family)
    return tr.speculators_args(cfg, verifier="results/models/t", data_dir=tmp_path, save_dir=tmp_path,
                               d2t=tmp_path / "d2t.npy", t2d=tmp_path / "t2d.npy", aux_layers=[2, 15, 27],
                               train_ratio=0.9, device=device, log_dir=tmp_path, num_workers=1, compile_=compiled,
                               loss_implementation="fused" if platform.is_cuda(device) else "eager",
                               mask_token_id=None if family == "eagle3" else 7)


@pytest.mark.parametrize("family", FAMILIES)
def test_every_family_probes_its_own_loss_on_cuda(family, tmp_path, monkeypatch):
    """A block family leaves its loss to speculators' recipe (null in its settings): the probe on a GPU
    got that None in its command line, and subprocess.run raised TypeError before training started."""
    commands = []

    def run(command, **kwargs):
        commands.append(command)
        return subprocess.CompletedProcess(command, 0, "", "")

    monkeypatch.setattr(probe.subprocess, "run", run)
    cfg = families.settings(train_view(families=[family]), family)
    choice = probe.choose(AUTO, cfg, "cuda")
    assert (choice.loss_implementation, choice.compile) == ("fused", True), choice
    speculators_loss = resolve(trainer_argv(tmp_path, family, "cuda", True))["loss_fn"]
    assert [c[3:] for c in commands] == [[speculators_loss, "eager", "on", "cuda"],
                                         [speculators_loss, "fused", "on", "cuda"]]
    assert all(isinstance(arg, str) for c in commands for arg in c)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize(("device", "compiled", "attention"), [
    ("cuda", True, "simple_flex_attention"), ("cuda", False, "sdpa"), ("cpu", False, "sdpa")])
def test_the_draft_attention_follows_the_device_and_the_compilation(family, device, compiled, attention, tmp_path):
    """Uncompiled on a GPU (train.compile off, or its probe failed) speculators kept FlexAttention, which
    uncompiled materialises every score: ~26 GB at a user's total_seq_len 8,192."""
    argv = trainer_argv(tmp_path, family, device, compiled)
    flat = resolve(argv)
    assert flat["draft_attn_impl"] == attention
    assert (tr.NO_COMPILE in argv) is not compiled


def test_the_compiled_probe_runs_the_draft_attention_too(monkeypatch):
    """The compile probe compiled the loss alone: a FlexAttention the GPU's compiler cannot build passed
    it. Here compilation is left out (seconds, not a minute) and the attention runs eagerly on the CPU,
    where FlexAttention has no backward: the compiled probe meets it, the uncompiled one does not."""
    import torch

    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    probe.run_probe("kl_div", "eager", False, "cpu")
    with pytest.raises(NotImplementedError, match="FlexAttention"):
        probe.run_probe("kl_div", "eager", True, "cpu")
