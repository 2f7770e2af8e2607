import json
from unittest.mock import patch

import pytest

from draftsmith.training import speculators_patches as patches
from draftsmith.training import train as tr

CFG = {"num_layers": 1, "epochs": 2, "lr": 1e-3, "optimizer": "muon", "weight_decay": 0.01, "scheduler": "cosine",
       "warmup_steps": None, "warmup_ratio": 0.1, "total_seq_len": 512, "ttt_steps": 3, "ttt_step_loss_decay": 1.0,
       "seed": 0, "max_steps": None, "architecture": "eagle3", "fc_norm": False, "draft_arch": "llama",
       "loss_fn": "kl_div", "train_lm_head": False}


def args(tmp_path, **kw):
    base = {"verifier": "results/models/t", "data_dir": tmp_path, "save_dir": tmp_path, "d2t": tmp_path / "d2t.npy",
            "t2d": tmp_path / "t2d.npy", "aux_layers": [2, 15, 27], "train_ratio": 0.9, "device": "cpu",
            "log_dir": tmp_path, "num_workers": 1}
    return tr.speculators_args(CFG, **{**base, **kw})


def value(argv, flag):
    return argv[argv.index(flag) + 1]


def test_speculators_arguments(tmp_path):
    argv = args(tmp_path)
    assert "--trust-remote-code" not in argv and "--trust-remote-code" in args(tmp_path, trust_remote_code=True)
    i = argv.index("--target-layer-ids")
    assert argv[i + 1:i + 4] == ["2", "15", "27"]
    assert value(argv, "--loss-implementation") == "eager" and value(argv, "--draft-attn-impl") == "sdpa"
    assert value(argv, "--scheduler-type") == "cosine" and value(argv, "--scheduler-warmup-ratio") == "0.1"
    assert value(argv, "--optimizer") == "muon" and value(argv, "--on-missing") == "raise"
    assert {"--no-norm-before-residual", "--no-norm-before-fc", "--no-norm-output"} <= set(argv)
    assert "--max-steps" not in argv and "--from-pretrained" not in argv
    assert tr.NO_COMPILE in argv  # the CPU computes eagerly
    gpu = args(tmp_path, device="cuda", from_pretrained=tmp_path / "pre", vllm_endpoint="http://h:1/v1",
               loss_implementation="fused", compile_=True)
    assert value(gpu, "--loss-implementation") == "fused" and value(gpu, "--from-pretrained") == str(tmp_path / "pre")
    assert tr.NO_COMPILE not in gpu and value(gpu, "--draft-attn-impl") == "simple_flex_attention"
    assert "--num-layers" not in gpu and "--no-norm-output" not in gpu  # the checkpoint defines the model
    assert value(gpu, "--on-missing") == "generate" and value(gpu, "--vllm-endpoint") == "http://h:1/v1"
    # The arguments are what speculators' own parser accepts.
    from speculators.train.config import TrainConfig

    import draftsmith.hidden_states.store  # noqa: F401 - registers the backend

    def resolve(argv):
        return TrainConfig.resolve([a for a in argv if a not in tr.OWN_FLAGS])

    resolve(args(tmp_path, from_pretrained=tmp_path / "pre"))  # no conflicting model flags
    resolved = resolve(args(tmp_path, hidden_states_backend="draftsmith")).flatten()
    assert resolved["norm_before_residual"] is False and resolved["scheduler_type"] == "cosine"
    assert resolved["hidden_states_backend"] == "draftsmith" and resolved["checkpoint_freq"] == 1


def test_several_gpus_run_the_same_worker_under_torchrun(tmp_path):
    assert tr.torchrun_accepts(tr.SHUTDOWN_TIMEOUT_FLAG)  # torch 2.13, pinned here
    cmd = tr.torchrun_command(8, tmp_path / "v.jsonl", ["--epochs", "5"], shutdown_timeout=True)
    assert cmd[1:5] == ["-m", "torch.distributed.run", "--standalone", "--nproc-per-node=8"]
    assert cmd[5] == f"--shutdown-timeout={tr.RANKS_STOP_TIMEOUT_S}"  # not torchrun's 30 s before SIGKILL
    assert cmd[6:9] == ["-m", "draftsmith.training.train", str(tmp_path / "v.jsonl")] and cmd[-2:] == ["--epochs", "5"]


def without_shutdown_timeout():
    """torchrun's parser as torch 2.11's (the lent H200's), which has no --shutdown-timeout."""
    from torch.distributed.run import get_args_parser

    parser = get_args_parser()
    for action in [a for a in parser._actions if tr.SHUTDOWN_TIMEOUT_FLAG in a.option_strings]:
        parser._remove_action(action)
        for flag in action.option_strings:
            del parser._option_string_actions[flag]
    return parser


def test_a_torchrun_without_the_shutdown_flag_gets_a_command_it_parses(tmp_path, monkeypatch):
    """torch 2.11's torchrun refused the command with 'unrecognized arguments: --shutdown-timeout=180'
    (issue 37): the flag is passed only where the installed torchrun takes it."""
    import torch.distributed.run as torchrun

    old = without_shutdown_timeout()
    monkeypatch.setattr(torchrun, "get_args_parser", lambda: old)
    assert not tr.torchrun_accepts(tr.SHUTDOWN_TIMEOUT_FLAG)
    cmd = tr.torchrun_command(2, tmp_path / "v.jsonl", ["--epochs", "5"],
                              shutdown_timeout=tr.torchrun_accepts(tr.SHUTDOWN_TIMEOUT_FLAG))
    parsed = old.parse_args(cmd[3:])  # an unknown flag exits with argparse's error
    assert parsed.nproc_per_node == "2" and parsed.training_script == "draftsmith.training.train"


def test_without_the_shutdown_flag_a_stop_goes_to_the_ranks_not_torchrun(tmp_path):
    """An old torchrun kills its ranks 30 s after it is signalled itself: the job signals the ranks
    (torchrun's children) instead, and torchrun, untouched, exits once they have stopped."""
    import subprocess
    import sys

    script = ("import signal, subprocess, sys, time\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(7))  # torchrun: signalled, it would give up\n"
              "rank = subprocess.Popen([sys.executable, '-c', 'import signal, sys, time\\n"
              "signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))\\nprint(1, flush=True)\\ntime.sleep(60)'],"
              " stdout=subprocess.PIPE)\n"
              "rank.stdout.readline(); print('ready', flush=True)\n"
              "sys.exit(3 if rank.wait() == 0 else 4)\n")
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "ready"
    tr._stop_ranks(launcher, shutdown_timeout=False)
    assert launcher.wait(timeout=30) == 3  # the rank stopped on its signal; the launcher was not signalled
    launcher = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "ready"
    tr._stop_ranks(launcher, shutdown_timeout=True)  # a new torchrun: signalled itself, it waits for its ranks
    assert launcher.wait(timeout=30) == 7


def test_simulated_tau_and_the_checkpoint_choice(tmp_path):
    validation = [{"epoch": e, "loss_epoch": loss, "full_acc_0_epoch": a0, "full_acc_1_epoch": a1,
                   "full_acc_2_epoch": a2} for e, loss, a0, a1, a2 in
                  [(0, 5.0, 0.30, 0.10, 0.03), (1, 4.0, 0.45, 0.20, 0.08), (2, 3.5, 0.40, 0.15, 0.05)]]
    assert tr.simulated_tau(validation[1]) == pytest.approx(1.73)
    for epoch in range(3):
        (tmp_path / str(epoch)).mkdir()
        (tmp_path / str(epoch) / "model.safetensors").write_bytes(b"x")
    (tmp_path / "checkpoint_best").symlink_to("2")
    path, choice = tr.choose_checkpoint(tmp_path, validation)
    # τ peaks at epoch 1 while the loss still falls: epoch 1 is exported, not the last.
    assert path == tmp_path / "1" and choice["epoch"] == 1 and "best simulated τ 1.730 of 3" in choice["reason"]
    path, choice = tr.choose_checkpoint(tmp_path, [])
    assert path == tmp_path / "2" and "no validation" in choice["reason"]


def test_a_graceful_stop_leaves_a_checkpoint_speculators_resumes(tmp_path):
    (tmp_path / "0").mkdir()
    (tmp_path / "interrupted").mkdir()
    (tmp_path / "interrupted" / "model.safetensors").write_bytes(b"weights")
    message = tr._resumable(tmp_path, {"epoch": 1, "epoch_start_step": 40, "global_step": 57, "interrupted": True})
    assert "epoch 2, step 17" in message and "rerun resumes" in message
    assert (tmp_path / "1" / "model.safetensors").read_bytes() == b"weights" and not (tmp_path / "interrupted").exists()
    assert json.loads((tmp_path / "1" / "training_state.json").read_text()) == {"epoch": 1, "local_step": 17,
                                                                                 "global_step": 57}
    from speculators.train.checkpointer import SingleGPUCheckpointer

    assert SingleGPUCheckpointer(tmp_path).previous_epoch == 1  # speculators resumes from it, mid-epoch


def test_a_speculators_release_the_patches_were_not_written_for_is_refused(monkeypatch):
    import importlib
    import importlib.metadata

    importlib.reload(patches)  # the pinned release passes
    monkeypatch.setattr(importlib.metadata, "version", lambda name: "0.10.0")
    with pytest.raises(ValueError, match=r"speculators 0.10.0 is installed.*written for 0.9.0") as refused:
        importlib.reload(patches)  # importing the patches checks, before any of them can apply
    assert type(refused.value).__name__ == "SpeculatorsVersionError"  # reloading made the class anew


def test_cpu_adaptation_redirects_the_trainer():
    from speculators.train import checkpointer, trainer

    assert patches.adapt_for_cpu() is True  # this machine has no accelerator
    assert trainer.get_local_rank() == "cpu" and checkpointer.get_current_device() == "cpu"


def log_validation(path, *records, monotonic):
    import logging

    with patch.object(tr.time, "monotonic", side_effect=monotonic):
        collector = tr._ValidationMetrics(path)
        log = logging.getLogger("speculators.metrics.test")
        log.addHandler(collector)
        log.setLevel(logging.INFO)
        try:
            for record in records:
                log.info(record)
        finally:
            log.removeHandler(collector)


def test_validation_metrics_survive_a_resume_and_carry_the_training_time(tmp_path):
    path = tmp_path / "validation.jsonl"
    log_validation(path, {"val": {"loss_epoch": 3.0}, "epoch": 0},
                   {"train": {"loss": 9.0}},  # training steps are not validation
                   monotonic=[100.0, 160.0])
    with path.open("a") as fh:
        fh.write('{"epoch": 1, "loss_ep')  # cut by a kill
    # Resumed: this process's 40 s add to the 60 s already spent.
    log_validation(path, {"val": {"loss_epoch": 2.0}, "epoch": 1}, monotonic=[5.0, 45.0])
    assert tr.read_validation(path) == [{"epoch": 0, "loss_epoch": 3.0, "train_s": 60.0},
                                        {"epoch": 1, "loss_epoch": 2.0, "train_s": 100.0}]


class _Slow:
    def __len__(self):
        return 6

    def __getitem__(self, i):
        import os
        import time

        time.sleep(0.3)
        return os.getpid()


def test_dataloader_workers_outlive_a_sigterm_to_the_whole_job():
    """SLURM signals every process of a job; the workers must live until the checkpoint is saved."""
    import os
    import signal

    from torch.utils.data import DataLoader

    patches.keep_workers_through_sigterm()
    loader = iter(DataLoader(_Slow(), batch_size=1, num_workers=1, multiprocessing_context="spawn"))
    worker_pid = int(next(loader))
    os.kill(worker_pid, signal.SIGTERM)
    assert [int(b) for b in loader] == [worker_pid] * 5  # the same worker served the rest


def test_quality_levers_reach_speculators(tmp_path):
    from speculators.train.config import TrainConfig

    argv = tr.speculators_args({**CFG, "fc_norm": True, "draft_arch": "qwen3", "loss_fn": "lk_hybrid",
                                "train_lm_head": True},
                               verifier="results/models/t", data_dir=tmp_path, save_dir=tmp_path,
                               d2t=tmp_path / "d2t.npy", t2d=tmp_path / "t2d.npy", aux_layers=[2, 15, 27],
                               train_ratio=0.9, device="cpu", log_dir=tmp_path, num_workers=1, dtype="float32")
    assert tr.TRAIN_LM_HEAD in argv  # draftsmith's own flag, taken out before speculators parses
    flat = TrainConfig.resolve([a for a in argv if a not in tr.OWN_FLAGS]).flatten()
    assert (flat["fc_norm"], flat["draft_arch"], flat["loss_fn"], flat["hidden_states_dtype"]) == \
        (True, "qwen3", "lk_hybrid", "float32")
    # With either architecture, fc_norm replaces the norm before fc: speculators refuses both.
    for architecture in tr.ARCHITECTURE_FLAGS:
        argv = tr.speculators_args({**CFG, "architecture": architecture, "fc_norm": True},
                                   verifier="results/models/t", data_dir=tmp_path, save_dir=tmp_path,
                                   d2t=tmp_path / "d2t.npy", t2d=tmp_path / "t2d.npy", aux_layers=[2, 15, 27],
                                   train_ratio=0.9, device="cpu", log_dir=tmp_path, num_workers=1, dtype="float32")
        draft = TrainConfig.resolve([a for a in argv if a not in tr.OWN_FLAGS]).flatten()
        assert draft["fc_norm"] and not draft["norm_before_fc"], architecture
        assert argv.count(tr.NO_NORM_BEFORE_FC) == 1
    # A warm start takes its model definition from the checkpoint.
    warm = args(tmp_path, from_pretrained=tmp_path)
    assert "--fc-norm" not in warm and "--draft-arch" not in warm


def test_muon_orthogonalises_in_fp32_where_bf16_is_emulated():
    import torch
    from torch.optim import _muon

    grad = torch.randn(64, 192, generator=torch.Generator().manual_seed(0))
    ours = patches.newton_schulz_fp32(grad, (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C), 5, 1e-7)
    theirs = _muon._zeropower_via_newtonschulz(grad, (_muon.DEFAULT_A, _muon.DEFAULT_B, _muon.DEFAULT_C), 5, 1e-7)
    assert ours.dtype == torch.float32 and theirs.dtype == torch.bfloat16
    assert torch.allclose(ours, theirs.float(), atol=0.05)  # the same iteration, without bf16 rounding


def _ignore_sigterm_and_sleep():
    import signal
    import time

    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    time.sleep(60)


def test_a_failed_step_does_not_leave_workers_that_block_the_exit():
    import multiprocessing

    worker = multiprocessing.get_context("spawn").Process(target=_ignore_sigterm_and_sleep, daemon=True)
    worker.start()
    patches.stop_dataloader_workers()
    worker.join(10)
    assert not worker.is_alive()


class _RankTrainer:
    """speculators' Trainer as far as a stop concerns it: a DDP model, ``train_epoch`` with
    ``step_callback``, ``run_training`` under speculators' own graceful-shutdown decorator, and a save
    that meets the other ranks in collectives (a barrier)."""

    def __init__(self, rank: int, out):
        import torch
        from torch.nn.parallel import DistributedDataParallel

        self.rank, self.out, self.global_step = rank, out, 0
        self.model = DistributedDataParallel(torch.nn.Linear(64, 64))
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.01)
        self.checkpointer = type("Checkpointer", (), {"path": out})

    def train_epoch(self, epoch, *, step_callback=None):
        import os
        import signal

        import torch

        for _ in range(200):
            if self.rank == 1 and self.global_step == 3:
                os.kill(os.getpid(), signal.SIGTERM)  # this rank alone, mid-step
            self.model(torch.randn(8, 64)).square().mean().backward()
            self.optimizer.step()
            self.global_step += 1
            if step_callback is not None:
                step_callback()

    def maybe_save_checkpoint(self, label):
        import torch.distributed as dist

        dist.barrier()
        (self.out / f"rank{self.rank}").write_text(f"{label} {self.global_step}")

    def run_training(self):
        from speculators.train.graceful_shutdown import with_graceful_shutdown

        with_graceful_shutdown()(type(self).train_epoch)(self, 0)


def _train_one_rank(rank: int, out) -> None:
    from datetime import timedelta

    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2,
                            timeout=timedelta(seconds=20))
    patches.stop_together_after_a_step(_RankTrainer)
    _RankTrainer(rank, out).run_training()
    dist.destroy_process_group()


def test_ranks_signalled_at_different_points_stop_after_the_same_step(tmp_path):
    """A stop reaches torchrun's ranks at different points of a step (here: rank 1 only): they must
    save together, or they meet in different collectives and hang until torchrun kills them."""
    import multiprocessing

    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_train_one_rank, args=(rank, tmp_path)) for rank in (0, 1)]
    for proc in ranks:
        proc.start()
    for proc in ranks:
        proc.join(120)  # two spawned torch imports on a slow 2-core CPU
    for proc in ranks:
        proc.kill()
    saved = [(tmp_path / f"rank{rank}").read_text() if (tmp_path / f"rank{rank}").exists() else None
             for rank in (0, 1)]
    assert saved == ["interrupted 4", "interrupted 4"] and [p.exitcode for p in ranks] == [0, 0]



class _Drafter:
    """A drafter's shape for the head's sake: a trained body, and a head that arrives frozen (as
    speculators copies the target's)."""

    @staticmethod
    def build():
        import torch

        class Drafter(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = torch.nn.Linear(16, 16)
                self.lm_head = torch.nn.Linear(16, 32, bias=False).requires_grad_(False)

            def forward(self, x):
                return self.lm_head(self.fc(x))

        return Drafter()


class _HeadTrainer:
    """speculators' Trainer as far as the LM head concerns it: its own ``_setup_model_ddp`` and
    ``build_optimizers``, called in the order its ``__init__`` calls them."""

    def __init__(self):
        self.local_rank = "cpu"
        self.model = _Drafter.build()
        self.setup_model()
        self.setup_optimizer()

    def setup_model(self):
        from speculators.train.trainer import Trainer

        Trainer._setup_model_ddp(self, load_checkpoint=False)

    def setup_optimizer(self):
        from types import SimpleNamespace

        from speculators.train.optimizers import build_optimizers

        self.optimizers = build_optimizers(self.model, SimpleNamespace(optimizer="adamw", lr=0.01, weight_decay=0.0))


def _train_head_on_one_rank(rank: int, out) -> None:
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{out}/store", rank=rank, world_size=2,
                            timeout=timedelta(seconds=30))
    patches.train_lm_head(_HeadTrainer)
    trainer = _HeadTrainer()
    initial = trainer.model.module.lm_head.weight.detach().clone()
    torch.manual_seed(rank)  # every rank its own rows, as the sampler hands them out
    for _ in range(5):
        trainer.model(torch.randn(4, 16)).square().mean().backward()
        for optimizer in trainer.optimizers:
            optimizer.step()
            optimizer.zero_grad()
    torch.save((initial, trainer.model.module.lm_head.weight.detach()), out / f"head{rank}.pt")
    dist.destroy_process_group()


def test_a_trained_head_stays_the_same_on_every_rank(tmp_path):
    """train.train_lm_head under torchrun: the ranks' heads must get the averaged gradient (DDP
    decides what it synchronises when it wraps the model), or each rank exports another head."""
    import multiprocessing

    import torch

    ctx = multiprocessing.get_context("spawn")
    ranks = [ctx.Process(target=_train_head_on_one_rank, args=(rank, tmp_path)) for rank in (0, 1)]
    for proc in ranks:
        proc.start()
    for proc in ranks:
        proc.join(120)
    assert [p.exitcode for p in ranks] == [0, 0]
    (initial, head0), (_, head1) = (torch.load(tmp_path / f"head{rank}.pt") for rank in (0, 1))
    assert not torch.equal(head0, initial)  # it trained
    assert torch.equal(head0, head1)


AUTO = {"loss_implementation": "auto", "compile": "auto"}


def test_the_fused_loss_falls_back_to_eager_when_its_probe_fails(caplog):
    """On the lent H200 the fused loss broke torch 2.11's dynamo in the first step (issue 37). Here the
    probes are asked to run on CUDA, which this CPU machine lacks, so they fail for real: ``auto``
    trains eagerly and uncompiled, and the log and the summary say why."""
    import logging

    from draftsmith.training import probe

    with caplog.at_level(logging.WARNING, logger="draftsmith.training.probe"):
        choice = probe.choose(AUTO, CFG, "cuda")
    assert (choice.loss_implementation, choice.compile) == ("eager", False)
    assert "torch.compile failed its probe" in choice.reason and "the fused loss failed its probe uncompiled" in \
        choice.reason and "so eager" in choice.reason
    assert "fused loss failed its probe" in caplog.text
    assert probe.probe("kl_div", "eager", False, "cpu") is None  # the probe itself works where it can
    fixed = probe.choose({"loss_implementation": "eager", "compile": False}, CFG, "cuda")  # YAML's `off`
    assert (fixed.loss_implementation, fixed.compile) == ("eager", False) and "set in the config" in fixed.reason
    on_cpu = probe.choose(AUTO, CFG, "cpu")
    assert (on_cpu.loss_implementation, on_cpu.compile) == ("eager", False) and "no CUDA device" in on_cpu.reason
    with pytest.raises(ValueError, match=r"train\.loss_implementation: fused need a CUDA GPU"):
        probe.choose({**AUTO, "loss_implementation": "fused"}, CFG, "cpu")


def test_phases_time_the_one_time_costs_apart_from_the_steps(tmp_path, monkeypatch, caplog):
    """Launch, build, first step (compilation), first validation, steady steps/s, and a heartbeat
    that names the phase while nothing else is logged."""
    import logging

    monkeypatch.setattr(tr, "HEARTBEAT_S", 0.05)
    now = [100.0]

    def at(seconds):
        now[0] = seconds

    with caplog.at_level(logging.INFO, logger=tr.log.name), \
            tr.Phases(tmp_path / "phases.json", launched_at=tr.time.time() - 12, clock=lambda: now[0]) as phases:
        at(101), phases.mark("build")
        at(103), phases.plan(400, 200), phases.enter("training")  # resumed at the second of two epochs
        at(110), phases.step()  # the first step, compilation in it
        for second in (110.5, 111, 111.5):
            at(second), phases.step()
        assert phases.progress() == "step 204 of 400, ~98 s of steps left"  # 196 at the steady 2 steps/s
        at(115), phases.enter("validation")
        at(121), phases.validated()
        tr.time.sleep(0.2)  # the heartbeat's turn
        at(122), phases.done()
    recorded = json.loads((tmp_path / "phases.json").read_text())
    assert 11 <= recorded["launch_s"] <= 14 and recorded["build_s"] == 1.0 and recorded["first_step_s"] == 10.0
    assert recorded["first_validation_s"] == 6.0 and recorded["steps_per_s"] == 2.0 and recorded["done_s"] == 22.0
    assert recorded["steps"] == 4 and "trainer: between epochs for" in caplog.text  # the heartbeat


def test_the_heartbeat_counts_the_runs_steps_as_speculators_does(tmp_path):
    """The run's steps are speculators' own count (max_steps, else epochs x its loader's batches), and a resumed
    run's heartbeat counts from the step it resumed at (speculators' global_step, mid-epoch too), not from 0."""
    import inspect
    from types import SimpleNamespace

    from speculators.train import trainer

    assert {"max_steps", "num_epochs"} <= set(trainer.TrainerConfig._fields)
    source = inspect.getsource(trainer)  # the module's, whatever a patch made of the class's methods since
    assert "self.train_loader = train_loader" in source and "self.global_step = self._resume_global_step" in source

    class Stub:
        def __init__(self, max_steps=None, global_step=0):
            self.config, self.train_loader = SimpleNamespace(max_steps=max_steps, num_epochs=3), [None] * 50
            self.global_step = global_step

        def train_epoch(self, epoch, step_callback=None):
            for _ in range(2):
                step_callback()

        def val_epoch(self, epoch):
            return {}

    phases = tr.Phases(tmp_path / "phases.json", clock=lambda: 100.0)  # no steady pace read: no time left said
    patches.time_phases(Stub, phases)
    Stub(global_step=117).train_epoch(2)  # resumed 17 batches into the third epoch
    assert phases.progress() == "step 119 of 150"
    Stub(max_steps=120).train_epoch(0)
    assert phases.progress() == "step 2 of 120"


def test_an_eagle3_run_made_before_families_resumes_from_where_it_was(tmp_path):
    """Its checkpoints were in results/train_runs/<key>/, now results/train_runs/eagle3/<key>/ (the same
    key): left behind, a finished run trained again from scratch."""
    runs = tmp_path / "results" / "train_runs"
    (runs / "abc123" / "checkpoints" / "2").mkdir(parents=True)
    (runs / "abc123" / "validation.jsonl").write_text("{}\n")
    assert not tr.adopt_earlier_run(runs / "dflash", "abc123", "dflash")  # never another family's
    assert tr.adopt_earlier_run(runs / "eagle3", "abc123", "eagle3")
    assert (runs / "eagle3" / "abc123" / "checkpoints" / "2").is_dir() and not (runs / "abc123").exists()
    assert not tr.adopt_earlier_run(runs / "eagle3", "abc123", "eagle3")  # once
