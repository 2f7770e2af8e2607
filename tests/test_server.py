import contextlib
import json
from pathlib import Path

import pytest

from draftsmith.config.target import Target
from draftsmith.generation.server import ServerError, ServerSpec, managed_server, server_env


def test_command_carries_engine_configs():
    spec = ServerSpec(model="m", max_model_len=1024, extra_args=["--enforce-eager"],
                      speculative_config={"method": "eagle3", "model": "results/drafter", "num_speculative_tokens": 3})
    cmd = spec.command(8000)
    assert cmd[1:3] == ["-m", "vllm.entrypoints.openai.api_server"]
    assert cmd[cmd.index("--port") + 1] == "8000" and cmd[cmd.index("--max-model-len") + 1] == "1024"
    assert json.loads(cmd[cmd.index("--speculative-config") + 1])["method"] == "eagle3"
    assert cmd[-1] == "--enforce-eager"


def test_thread_count_variables_are_not_inherited(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    monkeypatch.setenv("MKL_NUM_THREADS", "2")
    env = server_env({"VLLM_CPU_KVCACHE_SPACE": "1"})
    assert "OMP_NUM_THREADS" not in env and "MKL_NUM_THREADS" not in env
    assert env["VLLM_CPU_KVCACHE_SPACE"] == "1"
    assert server_env({"OMP_NUM_THREADS": "4"})["OMP_NUM_THREADS"] == "4"  # explicit config wins


def test_a_cpu_server_computes_on_every_core_unless_told_otherwise(monkeypatch):
    monkeypatch.delenv("VLLM_CPU_NUM_OF_RESERVED_CPU", raising=False)
    assert server_env({})["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "0"
    assert server_env({"VLLM_CPU_NUM_OF_RESERVED_CPU": "1"})["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "1"
    monkeypatch.setenv("VLLM_CPU_NUM_OF_RESERVED_CPU", "2")
    assert server_env({})["VLLM_CPU_NUM_OF_RESERVED_CPU"] == "2"


def test_cpu_only_engine_settings_come_from_the_machine_not_the_config(monkeypatch):
    from draftsmith.core import compute
    from draftsmith.generation.server import spec_from_config

    server = {"host": "127.0.0.1", "port": 0, "extra_args": ["--tensor-parallel-size", "8"], "env": {},
              "startup_timeout_s": 60, "dtype": "auto"}
    target = Target("q", "Qwen/Qwen3-8B", "hub")
    monkeypatch.setattr(compute, "has_accelerator", lambda: True)
    monkeypatch.setattr(compute, "bf16_native", lambda: (True, "test"))
    gpu = spec_from_config(target, server).command(1)
    assert "--enforce-eager" not in gpu  # CUDA graphs and compilation stay on for a GPU user
    monkeypatch.setattr(compute, "has_accelerator", lambda: False)
    cpu = spec_from_config(target, server).command(1)
    assert cpu.count("--enforce-eager") == 1 and cpu[-2:] == ["--tensor-parallel-size", "8"]
    assert spec_from_config(target, {**server, "extra_args": ["--enforce-eager"]}).command(1).count(
        "--enforce-eager") == 1
    # vLLM-CPU's worker runs in its engine's process (no second spawn and import of vLLM), unless the user's
    # flags ask for a parallel layout; a GPU server keeps vLLM's own executor.
    plain_cpu = spec_from_config(target, {**server, "extra_args": []})
    assert plain_cpu.command(1)[-2:] == ["--distributed-executor-backend", "uni"]
    assert plain_cpu.process_env() == {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    assert "uni" not in cpu and spec_from_config(target, server).process_env() == {}
    # a thread binding asked for (online hidden states split the cores so), or several NUMA nodes: the
    # multiprocess executor, which alone binds threads
    bound = spec_from_config(target, {**server, "extra_args": [], "env": {"VLLM_CPU_OMP_THREADS_BIND": "0"}})
    assert "uni" not in bound.command(1) and bound.process_env() == {"VLLM_CPU_OMP_THREADS_BIND": "0"}
    from draftsmith.generation import server as srv

    monkeypatch.setattr(srv, "numa_nodes", lambda: 2)
    assert "uni" not in spec_from_config(target, {**server, "extra_args": []}).command(1)
    monkeypatch.setattr(srv, "numa_nodes", lambda: 1)
    monkeypatch.setattr(compute, "has_accelerator", lambda: True)
    assert "uni" not in spec_from_config(target, {**server, "extra_args": []}).command(1)
    monkeypatch.delenv("VLLM_CPU_KVCACHE_SPACE", raising=False)
    assert server_env({})["VLLM_CPU_KVCACHE_SPACE"] == "2"  # vLLM-CPU does not start without one
    assert server_env({"VLLM_CPU_KVCACHE_SPACE": "1"})["VLLM_CPU_KVCACHE_SPACE"] == "1"


def test_server_that_dies_reports_its_log(tmp_path):
    spec = ServerSpec(model=str(tmp_path / "no-such-model"), startup_timeout_s=300)
    with pytest.raises(ServerError, match="exited with code") as err, managed_server(spec, tmp_path / "server.log"):
        pass
    assert "last lines of" in str(err.value)


def test_how_a_server_ended_is_read_before_draftsmith_stops_it(tmp_path, monkeypatch):
    """Read after the server's context closed, a server draftsmith itself stopped showed -15 (its SIGTERM), and
    a method's own failure on a live server counted as the machine's, failing every rerun. What ended it is
    read before it is stopped: nothing for a live one, the signal for one the OOM killer ended."""
    import os
    import signal
    import sys

    health = ("import http.server, sys\n"
              "class H(http.server.BaseHTTPRequestHandler):\n"
              "    def do_GET(self): self.send_response(200); self.end_headers()\n"
              "    def log_message(self, *args): pass\n"
              "http.server.HTTPServer(('127.0.0.1', int(sys.argv[1])), H).serve_forever()\n")
    monkeypatch.setattr(ServerSpec, "command", lambda self, port: [sys.executable, "-c", health, str(port)])
    spec = ServerSpec(model="m", startup_timeout_s=60)
    with managed_server(spec, tmp_path / "alive.log") as alive:
        pass
    assert alive.exited_before_stop is None and alive.proc.returncode < 0  # our own stop
    with pytest.raises(RuntimeError), managed_server(spec, tmp_path / "killed.log") as killed:
        os.kill(killed.proc.pid, signal.SIGKILL)
        killed.proc.wait()
        raise RuntimeError("the request failed")
    assert killed.exited_before_stop == -signal.SIGKILL


def test_sglang_command_and_its_limits():
    from draftsmith.generation.server import generation_spec

    server = {"host": "127.0.0.1", "port": 0, "max_model_len": 4096, "extra_args": ["--enforce-eager"],
              "env": {"A": 1}, "startup_timeout_s": 60, "dtype": "float32"}
    gen = {"engine": "sglang", "extra_args": ["--tp", "8", "--reasoning-parser", "kimi_k2"], "env": {"B": "2"}}
    kimi = Target("kimi", "moonshotai/Kimi-K2.5", "hub", trust_remote_code=True)
    spec = generation_spec(kimi, server, gen)
    cmd = spec.command(30000)
    assert cmd[1:3] == ["-m", "sglang.launch_server"]
    assert cmd[cmd.index("--model-path") + 1] == "moonshotai/Kimi-K2.5"
    assert cmd[cmd.index("--context-length") + 1] == "4096"
    assert cmd[-4:] == ["--tp", "8", "--reasoning-parser", "kimi_k2"] and "--enforce-eager" not in cmd
    assert spec.env == {"A": "1", "B": "2"} and cmd[cmd.index("--dtype") + 1] == "float32"
    assert cmd.count("--trust-remote-code") == 1  # the target's own code: SGLang needs the flag as vLLM does
    spec.speculative_config = {"method": "eagle3"}
    with pytest.raises(ValueError, match="extraction runs on vLLM"):
        spec.command(1)
    plain = generation_spec(Target("m", "m", "hub"), server, {"engine": "vllm", "extra_args": None, "env": {}})
    assert plain.extra_args == ["--enforce-eager"] and "--trust-remote-code" not in plain.command(1)
    assert generation_spec(kimi, server, {"engine": "vllm", "extra_args": ["--trust-remote-code"], "env": {}}
                           ).command(1).count("--trust-remote-code") == 1


def test_each_engine_gets_its_own_flags_in_evaluation_and_generation(tmp_path):
    """vLLM's --tensor-parallel-size is SGLang's --tp: an 8-GPU SGLang evaluation lost its --tp when the
    speculative flags replaced the user's, and a SGLang baseline got vLLM's flags."""
    from draftsmith.evaluation.measure.evaluate import drafted_per_step, server_spec
    from draftsmith.generation.server import generation_spec

    server = {"host": "127.0.0.1", "port": 0, "max_model_len": None, "env": {}, "startup_timeout_s": 60,
              "dtype": "bfloat16", "extra_args": ["--tensor-parallel-size", "8"], "sglang_args": ["--tp", "8"]}
    target = Target("m", "m", "hub")
    drafter = tmp_path / "drafter"
    drafter.mkdir()
    (drafter / "config.json").write_text(json.dumps({"speculators_model_type": "eagle3"}))
    for method, where in ((None, None), ("eagle3", str(drafter))):
        sglang = server_spec("sglang", target, server, method, 3, where).command(1)
        assert sglang[sglang.index("--tp") + 1] == "8" and "--tensor-parallel-size" not in sglang
        vllm = server_spec("vllm", target, server, method, 3, where).command(1)
        assert vllm[vllm.index("--tensor-parallel-size") + 1] == "8" and "--tp" not in vllm
    assert "--speculative-algorithm" in sglang
    # A block drafter is served as its own method, drafting its trained block minus the anchor.
    (drafter / "config.json").write_text(json.dumps({"speculators_model_type": "dflash", "block_size": 8}))
    vllm = server_spec("vllm", target, server, *drafted_per_step(str(drafter), 3), str(drafter)).command(1)
    assert json.loads(vllm[vllm.index("--speculative-config") + 1]) == {
        "method": "dflash", "model": str(drafter), "num_speculative_tokens": 7}
    # A training-free method needs no drafter: n-gram with its prompt lookup settings.
    vllm = server_spec("vllm", target, server, "ngram", 2, None, {"ngram": {"prompt_lookup_min": 2,
                                                                           "prompt_lookup_max": 4}}).command(1)
    assert json.loads(vllm[vllm.index("--speculative-config") + 1]) == {
        "method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 2, "prompt_lookup_max": 4}
    # Suffix decoding without its tree of earlier answers: the grid sends each prompt more than once, and
    # an earlier answer to the same prompt would be drafted as if predicted.
    vllm = server_spec("vllm", target, server, "suffix", 3, None, {}).command(1)
    assert json.loads(vllm[vllm.index("--speculative-config") + 1]) == {
        "method": "suffix", "num_speculative_tokens": 3, "suffix_decoding_max_cached_requests": 0}
    generation = generation_spec(target, server, {"engine": "sglang", "extra_args": None, "env": {}}).command(1)
    assert generation[generation.index("--tp") + 1] == "8" and "--tensor-parallel-size" not in generation


def test_server_dies_with_a_killed_job(tmp_path):
    """kill -9 of the job must not leave the server running (it would hold the GPUs)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = ("import sys, time\nfrom pathlib import Path\nfrom draftsmith.generation import server\n"
              "server.ServerSpec.command = lambda self, port: [sys.executable, '-c', 'import time; time.sleep(600)']\n"
              "server._wait_healthy = lambda *a: None\n"
              f"with server.managed_server(server.ServerSpec(model='m'), Path({str(tmp_path / 'log')!r})):\n"
              "    print(flush=True)\n    time.sleep(600)\n")
    job = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
    job.stdout.readline()
    children = subprocess.run(["pgrep", "-P", str(job.pid)], capture_output=True, text=True).stdout.split()
    assert len(children) == 1
    os.kill(job.pid, signal.SIGKILL)
    job.wait()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline and os.path.exists(f"/proc/{children[0]}"):
        time.sleep(0.1)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(int(children[0]), os.WNOHANG)
    status_file = Path(f"/proc/{children[0]}/status")
    status = status_file.read_text() if status_file.exists() else "gone"
    assert status == "gone" or "State:\tZ" in status, status
