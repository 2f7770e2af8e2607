"""The compute dtype follows what the machine runs natively; a user's choice wins."""

import subprocess
import sys

import pytest

from draftsmith.config.target import Target
from draftsmith.core import compute
from draftsmith.generation.server import ServerSpec, spec_from_config

SERVER = {"host": "127.0.0.1", "port": 0, "max_model_len": None, "extra_args": [], "env": {},
          "startup_timeout_s": 60, "dtype": "auto"}


def test_a_cpu_without_native_bf16_computes_in_fp32():
    # ATEN_CPU_CAPABILITY=avx2 makes any x86 CPU report what an AVX2-only EPYC reports.
    code = "from draftsmith.core import compute; c = compute.choose(); print(c.dtype, '|', c.reason)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env={"ATEN_CPU_CAPABILITY": "avx2", "PATH": ""}).stdout.strip()
    assert out == "float32 | CPU capability AVX2, bf16 emulated"


@pytest.mark.parametrize("avx512_bf16, amx, expected", [(False, False, "float32"), (True, False, "bfloat16"),
                                                        (False, True, "bfloat16")])
def test_avx512_alone_is_not_native_bf16(monkeypatch, avx512_bf16, amx, expected):
    """An AVX-512 CPU without the avx512_bf16 or AMX instructions: oneDNN still says it supports bf16
    (by conversion), and `auto` computed bf16 there at a third of fp32's speed (1024² matmul, one
    thread: 23 against 59-80 GFLOP/s; a linear layer's forward and backward 2.8x slower)."""
    import torch

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: False)  # the CPU path, on any machine
    monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda: "AVX512")
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: True)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: avx512_bf16)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: amx)
    choice = compute.choose("auto")
    assert choice.dtype == expected
    if expected == "float32":
        assert choice.reason == "CPU capability AVX512 without avx512_bf16 or AMX, bf16 emulated"


@pytest.mark.parametrize("native, expected", [(True, "bfloat16"), (False, "float32")])
def test_auto_follows_the_machine_and_a_set_dtype_wins(monkeypatch, native, expected):
    monkeypatch.setattr(compute, "bf16_native", lambda: (native, "test"))
    assert compute.choose("auto").dtype == expected
    assert compute.choose("bfloat16") == compute.Choice("bfloat16", "set in the config")
    with pytest.raises(ValueError, match="unknown compute dtype 'fp8'"):
        compute.choose("fp8")


def test_servers_get_the_chosen_dtype_unless_the_user_passed_one(monkeypatch):
    monkeypatch.setattr(compute, "bf16_native", lambda: (False, "test"))
    cmd = spec_from_config(Target("m", "m", "hub"), SERVER).command(1)
    assert cmd[cmd.index("--dtype") + 1] == "float32"
    cmd = spec_from_config(Target("m", "m", "hub"), {**SERVER, "extra_args": ["--dtype", "half"]}).command(1)
    assert cmd.count("--dtype") == 1 and cmd[cmd.index("--dtype") + 1] == "half"
    assert "--dtype" not in ServerSpec(model="m").command(1)


def test_a_gpu_without_bf16_serves_in_fp16_and_trains_in_fp32(monkeypatch):
    """A V100 or T4 (compute capability 7.x): vLLM refuses bf16 there, speculators cannot train in fp16."""
    import torch

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: False)
    monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None: (7, 0))
    serving, training = compute.choose("auto"), compute.choose("auto", training=True)
    assert (serving.dtype, training.dtype) == ("float16", "float32")
    assert "compute capability 7.0" in serving.reason
    assert compute.device() == "cuda"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda including_emulation=True: True)
    assert compute.choose("auto") == compute.Choice("bfloat16", "accelerator cuda")
    with pytest.raises(ValueError, match="not float16"):
        compute.choose("float16", training=True)
