"""The decisions a job takes only on a CUDA GPU, called with ``cuda`` on this CPU for every family: the
trainer's probe and its arguments, the draft attention with compilation on and off. Only executing them
needs a GPU (benchmarks/gpu_check.sh); what they decide is tested here."""

import subprocess

import pytest
import torch

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
    assert [c[3:] for c in commands] == [[speculators_loss, "eager", "on", "cuda", "attention"],
                                         [speculators_loss, "fused", "on", "cuda", "loss"]]
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
    where FlexAttention has no backward: the compile probe meets it, the fused loss's probe does not."""
    monkeypatch.setattr(torch, "compile", lambda fn, **kw: fn)
    probe.run_probe("kl_div", "eager", True, "cpu")  # the fused loss's compiled probe: the loss alone
    with pytest.raises(NotImplementedError, match="FlexAttention"):
        probe.run_probe("kl_div", "eager", True, "cpu", attention=True)


def test_the_pinned_pool_hands_out_blocks_within_its_bound_and_in_order():
    """torch's pinned allocator rounds every block up to a power of two and keeps it: staged in a block
    per row, rows of mixed lengths grew page-locked memory past the queue's bound. The pool is one
    block, handed out as a ring and given back in order; a block never overlaps one still in use, and a
    take waits while the ring is full (a slow writer thread releases here, so it wraps and waits)."""
    import queue
    import random
    import threading
    import time

    from draftsmith.hidden_states.store import PinnedPool

    pool = PinnedPool(10_000, pin=False)
    assert pool.take(10_001) is None  # a row larger than the pool is copied without it
    taken: queue.Queue = queue.Queue()

    def release_slowly():
        while taken.get() is not None:
            time.sleep(0.001)
            pool.release()

    releaser = threading.Thread(target=release_slowly)
    releaser.start()
    rng = random.Random(0)
    wrapped = 0
    for _ in range(300):
        block = pool.take(rng.randrange(1, 4_000))
        start = block.data_ptr() - pool.buffer.data_ptr()
        with pool.changed:
            others = list(pool.live)[:-1]
        assert start % pool.ALIGN == 0 and start + block.numel() <= pool.capacity
        assert all(start + block.numel() <= o or o + n <= start for o, n in others), (start, others)
        wrapped += start == 0
        taken.put(block)
    taken.put(None)
    releaser.join()
    assert wrapped > 10 and pool.peak <= pool.capacity and not pool.live


def test_the_writer_sleeps_on_a_cuda_copy_instead_of_spinning(monkeypatch):
    """A default CUDA event's synchronize() spins a host core until the copy ends, once per row: the
    staging makes its event with the device's options (here the CPU stands in for CUDA)."""
    from draftsmith.core import platform
    from draftsmith.hidden_states import store

    assert platform.staging_event_options("cuda:3") == {"blocking": True}
    assert platform.staging_event_options("cpu") == {}
    made = []

    class Event:
        def __init__(self, **options):
            made.append(options)

        def record(self):
            pass

        def synchronize(self):
            made.append("waited")

    monkeypatch.setattr(store.platform, "pinned_staging", lambda device: True)
    options = platform.staging_event_options
    monkeypatch.setattr(store.platform, "staging_event_options", lambda device: options("cuda"))
    monkeypatch.setattr(torch.cpu, "Event", Event)
    staged = store._Staged({"hidden_states": torch.ones(2, 3)}, lambda: store.PinnedPool(4096, pin=False))
    assert torch.equal(staged.on_host()["hidden_states"], torch.ones(2, 3))
    assert made == [{"blocking": True}, "waited"]
    staged.release()


def test_rows_from_a_gpu_go_through_the_pool_and_are_stored_as_computed(tmp_path, monkeypatch):
    """The staging a CUDA row takes (pinned block, copy, event, release after the write), run on this
    CPU with the pool unpinned: rows of mixed lengths, some larger than the whole pool."""
    from draftsmith.hidden_states import store

    monkeypatch.setattr(store.platform, "pinned_staging", lambda device: True)
    shards = store.ShardStore(tmp_path / "hs", store.fingerprint({"t": 1}, [1, 2, 3], 4, "transformers"),
                              shard_mb=1)
    generator = torch.Generator().manual_seed(0)
    rows = {row: torch.randn(length, 4, 64, generator=generator).to(torch.bfloat16)
            for row, length in enumerate([5, 300, 17, 80, 3, 200, 1])}
    with shards.writer() as writer:
        writer.pool = store.PinnedPool(64 * 1024, pin=False)
        for row, values in rows.items():
            writer.write(row, values, torch.arange(len(values)))
    assert writer.pool.peak <= writer.pool.capacity and not writer.pool.live
    for row, values in rows.items():
        read = shards.read(row)
        assert torch.equal(read["hidden_states"], values) and read["token_ids"].tolist() == list(range(len(values)))


def test_the_accelerators_a_measurement_ran_on_are_named_on_cuda(monkeypatch):
    """The shared baseline is used only by a job on the same accelerators; on CUDA they are named by torch.cuda
    (a CPU job sees none)."""
    from draftsmith.core import compute

    assert compute.accelerators() == [] or torch.accelerator.is_available()
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "device_count", lambda: 2)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda i: f"NVIDIA H200 #{i}")
    assert compute.accelerators() == ["NVIDIA H200 #0", "NVIDIA H200 #1"]
