"""A server's failure is the machine's (retried, then the job fails and nothing is recorded) or the served
method's (recorded): read from the server's log, in vLLM's own words."""

import os
from contextlib import contextmanager
from pathlib import Path
from types import SimpleNamespace

import pytest

from draftsmith.data.datasets import Prompt
from draftsmith.evaluation.measure import evaluate as ev
from draftsmith.generation import server as srv
from draftsmith.generation.server import ServerExited

PREFIX = "(EngineCore_DP0 pid=4242) ERROR 12-06 10:02:11 [core.py:1512] "
# Log tails as vLLM 0.32 and its libraries write them (the texts grep'd from the installed packages).
TAILS = {
    srv.MEMORY_HELD: (
        f"{PREFIX}Traceback (most recent call last):\n"
        f"{PREFIX}  File \".../vllm/v1/worker/utils.py\", line 762, in request_memory\n"
        f"{PREFIX}ValueError: Free memory on device cuda:0 (3.1/79.19 GiB) on startup is less than desired GPU "
        "memory utilization (0.9, 71.27 GiB). Decrease GPU memory utilization or reduce GPU memory used by other "
        "processes.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore_DP0': 1}\n"),
    srv.CUDA_OOM: (
        f"{PREFIX}torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total "
        "capacity of 79.19 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 78.1 GiB "
        "memory in use.\n"
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
        "{'EngineCore_DP0': 1}\n"),
    srv.PORT_TAKEN: (
        "(APIServer pid=4100) INFO 12-06 10:02:40 [api_server.py:1012] Starting vLLM API server 0 on "
        "http://127.0.0.1:43117\n"
        "(APIServer pid=4100) ERROR:    [Errno 98] error while attempting to bind on address ('127.0.0.1', "
        "43117): address already in use\n"),
    srv.HUB_UNREACHABLE: (
        "(APIServer pid=4100) Traceback (most recent call last):\n"
        "huggingface_hub.errors.LocalEntryNotFoundError: An error happened while trying to locate the file on the "
        "Hub and we cannot find the requested files in the local cache. Please check your connection and try "
        "again or make sure your Internet connection is on.\n"
        "OSError: We couldn't connect to 'https://huggingface.co' to load the files, and couldn't find them in the "
        "cached files.\n"),
    srv.ENGINE_KILLED: (
        "(APIServer pid=4100) INFO 12-06 10:05:02 [loggers.py:257] Engine 000: Avg generation throughput: 812.4 "
        "tokens/s, Running: 16 reqs\n"
        "(APIServer pid=4100) WARNING 12-06 10:05:09 [core_client.py:818] [shutdown] MPClient: engine core exited "
        "unexpectedly; starting cleanup\n"
        "(APIServer pid=4100) ERROR 12-06 10:05:09 [async_llm.py:787] AsyncLLM output_handler failed.\n"
        "(APIServer pid=4100) vllm.v1.engine.exceptions.EngineDeadError: EngineCore encountered an issue. See "
        "stack trace (above) for the root cause.\n"),
}
# The served method's: the engine refusing the drafter, raising while drafting, a model the hub does not have.
METHODS = (
    f"{PREFIX}ValueError: No common block size for 16 (attention backends: FLASH_ATTN)\n"
    "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): "
    "{'EngineCore_DP0': 1}\n",
    f"{PREFIX}EngineCore encountered a fatal error.\n{PREFIX}Traceback (most recent call last):\n"
    f"{PREFIX}RuntimeError: shape '[16, 3, 4096]' is invalid for input of size 65536\n"
    "(APIServer pid=4100) WARNING 12-06 10:05:09 [core_client.py:818] [shutdown] MPClient: engine core exited "
    "unexpectedly; starting cleanup\n",
    "huggingface_hub.errors.RepositoryNotFoundError: 404 Client Error. Repository Not Found for url: "
    "https://huggingface.co/api/models/someone/no-such-drafter\n",
)


@pytest.mark.parametrize("cause", list(TAILS))
def test_each_machine_failure_is_read_from_the_servers_log(cause):
    assert srv.failure_cause(TAILS[cause]) == cause


@pytest.mark.parametrize("tail", METHODS)
def test_the_methods_own_failures_are_not_the_machines(tail):
    assert srv.failure_cause(tail) is None


def test_an_engine_killed_at_start_is_told_by_its_exit_code():
    killed = "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): " \
             "{'EngineCore_DP0': -9}\n"
    assert srv.failure_cause(killed) == srv.ENGINE_KILLED
    assert srv.failure_cause("ERROR [multiproc_executor.py:316] Worker proc VllmWorker-0 died unexpectedly "
                             "(exit code: -9), shutting down executor.") == srv.ENGINE_KILLED
    assert srv.failure_cause("Worker proc VllmWorker-0 died unexpectedly (exit code: 1)") is None


def test_only_this_servers_part_of_an_appended_log_is_read(tmp_path):
    """A job's servers append to one log: a first start's port race must not make a later start's refusal of
    the drafter the machine's."""
    log_path = tmp_path / "server.log"
    log_path.write_text(TAILS[srv.PORT_TAKEN])
    start = log_path.stat().st_size
    log_path.write_text(TAILS[srv.PORT_TAKEN] + METHODS[0])
    assert ServerExited("exited with code 1", 1, log_path, start).cause() is None
    assert ServerExited("exited with code 1", 1, log_path, 0).cause() == srv.PORT_TAKEN


GRID = ev.Grid({"held": [Prompt("a", ["hi"])]}, [0.0], 32, [2], False, "vllm")


def starts(tmp_path, tails: list[str | None], dies_with: str | None = None, dying_starts: int | None = None):
    """A fake server: each start exits with the next of ``tails`` written to its log (None: it starts); a started
    one ends with exit code 1 while serving, its log ``dies_with``, when that is given (the first
    ``dying_starts`` of them only, where given)."""
    log_path, calls = tmp_path / "server.log", []

    @contextmanager
    def start():
        calls.append(1)
        tail = tails[len(calls) - 1] if len(calls) <= len(tails) else None
        begun = log_path.stat().st_size if log_path.is_file() else 0
        if tail is not None:
            with log_path.open("a") as out:
                out.write(tail)
            raise ServerExited(f"server exited with code 1 before it was ready; last lines of {log_path}", 1,
                               log_path, begun)
        dies = dies_with and (dying_starts is None or len(calls) <= dying_starts)
        running = SimpleNamespace(base_url="dies" if dies else "up", exited_before_stop=None,
                                  cause=lambda: srv.failure_cause(srv.own_log(log_path, begun)))
        try:
            yield running
        finally:
            if dies:
                with log_path.open("a") as out:
                    out.write(dies_with)
                running.exited_before_stop = 1

    return start, calls


@pytest.fixture
def fake_grid(monkeypatch):
    waits, freed, before = [], [], SimpleNamespace(held=4096)  # before a start: a previous server's memory

    def runs_at(base_url, *args, **kwargs):
        if base_url == "dies":
            import httpx

            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return [{"set": "held", "temperature": 0.0, "prompts": 1, "output_tok_s": 50.0, "held": True}]

    monkeypatch.setattr(ev, "warm_up", lambda *args: None)
    monkeypatch.setattr(ev, "runs_at", runs_at)
    monkeypatch.setattr(ev.time, "sleep", waits.append)
    monkeypatch.setattr(ev, "wait_for_gpu_memory", lambda **kwargs: freed.pop(0))
    monkeypatch.setattr(ev, "gpu_memory_held", lambda: before.held)
    return SimpleNamespace(waits=waits, freed=freed, before=before)


def cells(server):
    return ev.measure_cells(GRID, "m", [{"concurrency": 2, "runs": [{"output_tok_s": 40.0, "held": True}]}],
                            {("finetuned", 3): server})["cells"]


def test_a_port_race_or_the_hub_is_started_again_and_measured(tmp_path, fake_grid):
    server, calls = starts(tmp_path, [TAILS[srv.PORT_TAKEN], TAILS[srv.HUB_UNREACHABLE]])
    measured = cells(server)
    assert len(calls) == 3 and "failed" not in measured[0] and measured[0]["runs"][0]["speedup"] == 1.25
    assert fake_grid.waits == [ev.PORT_WAIT_S, 2 * ev.RETRY_WAIT_S]


def test_a_machine_failure_at_every_start_fails_the_job_and_records_nothing(tmp_path, fake_grid):
    """Recorded, a hub outage at the method's start left the method out of every later pick."""
    server, calls = starts(tmp_path, [TAILS[srv.HUB_UNREACHABLE]] * ev.START_TRIES)
    with pytest.raises(ev.NotTheMethod, match=r"hub unreachable at each of 3 starts.*nothing is recorded"):
        cells(server)
    assert len(calls) == ev.START_TRIES


def test_gpu_memory_is_waited_for_then_a_drafter_that_does_not_fit_is_the_methods(tmp_path, fake_grid):
    """The previous server's memory not yet returned: wait for it, start again. Out of memory again on a GPU
    no one else held: the drafter does not fit, recorded as the method's without a third start."""
    server, calls = starts(tmp_path, [TAILS[srv.MEMORY_HELD], TAILS[srv.CUDA_OOM], TAILS[srv.CUDA_OOM]])
    fake_grid.freed.extend([True, True])
    measured = cells(server)
    assert len(calls) == 2 and measured[0]["failed"].startswith("ServerExited: server exited with code 1")
    # the memory freed in time: measured
    server, calls = starts(tmp_path / "b", [TAILS[srv.CUDA_OOM]])
    (tmp_path / "b").mkdir()
    fake_grid.freed.extend([True])
    assert "failed" not in cells(server)[0] and len(calls) == 2


def test_gpu_memory_still_held_by_another_process_fails_the_job(tmp_path, fake_grid):
    server, calls = starts(tmp_path, [TAILS[srv.CUDA_OOM]] * ev.START_TRIES)
    fake_grid.freed.extend([False, False])
    with pytest.raises(ev.NotTheMethod, match="other processes still held its GPUs' memory"):
        cells(server)
    assert len(calls) == ev.START_TRIES


def test_the_methods_failure_at_start_is_recorded_at_once(tmp_path, fake_grid):
    server, calls = starts(tmp_path, [METHODS[0]])
    assert cells(server)[0]["failed"].startswith("ServerExited") and len(calls) == 1 and not fake_grid.waits


def test_an_engine_that_raised_while_drafting_is_recorded_at_once(tmp_path, fake_grid):
    """vLLM's API server exits with 1 when its engine process is OOM-killed (served again, below); an engine
    that raised while drafting is the method's, recorded without another try."""
    server, calls = starts(tmp_path, [], dies_with=METHODS[1])
    assert cells(server)[0]["failed"].startswith("RemoteProtocolError") and len(calls) == 1


def test_gpu_memory_is_waited_for_until_no_other_process_holds_it():
    readings, slept = [2048, 512, 0], []
    assert ev.wait_for_gpu_memory(lambda: readings.pop(0), slept.append) is True and len(slept) == 2
    assert ev.wait_for_gpu_memory(lambda: 100, slept.append, timeout_s=10) is False
    assert ev.wait_for_gpu_memory(lambda: None, slept.append) is None


def test_out_of_memory_on_gpus_no_other_process_held_before_the_first_start_is_the_methods_at_once(tmp_path,
                                                                                                  fake_grid):
    """Read only after a failure, the first CUDA out-of-memory always cost a second start (tens of minutes for a
    1T target); the GPUs read free before it, the drafter does not fit: recorded at once."""
    fake_grid.before.held = 0
    server, calls = starts(tmp_path, [TAILS[srv.CUDA_OOM]] * ev.START_TRIES)
    assert cells(server)[0]["failed"].startswith("ServerExited") and len(calls) == 1 and not fake_grid.waits


def test_out_of_memory_where_gpu_memory_cannot_be_read_is_the_methods_after_one_retry(tmp_path, fake_grid):
    """MIG, ROCm or no nvidia-smi: a drafter too large for the GPU was retried into a failed job, on every
    rerun. Now one retry, then it is recorded and the run goes on."""
    fake_grid.before.held = None
    fake_grid.freed.extend([None, None])
    server, calls = starts(tmp_path, [TAILS[srv.CUDA_OOM]] * ev.START_TRIES)
    assert cells(server)[0]["failed"].startswith("ServerExited") and len(calls) == 2
    assert fake_grid.waits == [ev.RETRY_WAIT_S]


def test_an_engine_killed_at_every_try_while_serving_is_the_methods_with_its_cause(tmp_path, fake_grid):
    """A drafter whose load sets off the host's OOM killer each time failed the job on every rerun; killed at
    each of the tries in one job, it is recorded as the method's, its cause named."""
    server, calls = starts(tmp_path, [], dies_with=TAILS[srv.ENGINE_KILLED])
    measured = cells(server)
    assert len(calls) == ev.START_TRIES and fake_grid.waits == [ev.RETRY_WAIT_S, 2 * ev.RETRY_WAIT_S]
    assert measured[0]["failed"].startswith("its engine killed by a signal while serving, most often the host's OOM "
                                            "killer: its log shows the "
                                            "engine process killed while it served")


def test_an_engine_killed_once_while_serving_is_served_again_and_measured(tmp_path, fake_grid):
    deaths = [TAILS[srv.ENGINE_KILLED]]
    dying, _ = starts(tmp_path, [], dies_with=deaths[0])
    healthy, _ = starts(tmp_path / "b", [])
    served = []

    def server():
        served.append(1)
        return dying() if len(served) == 1 else healthy()

    measured = cells(server)
    assert len(served) == 2 and "failed" not in measured[0] and measured[0]["runs"][0]["speedup"] == 1.25


def fake_nvidia_smi(tmp_path, monkeypatch, output: str | None, visible: str | None = None) -> Path:
    """``nvidia-smi`` on PATH printing ``output`` and logging its arguments (None: no nvidia-smi at all)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    called = tmp_path / "called"
    if output is not None:
        script = bin_dir / "nvidia-smi"
        script.write_text(f"#!/bin/sh\necho \"$@\" >> {called}\nprintf '%s' '{output}'\n")  # shell builtins only
        script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))  # alone: a real nvidia-smi is not found either
    if visible is None:
        monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    else:
        monkeypatch.setenv("CUDA_VISIBLE_DEVICES", visible)
    return called


def test_gpu_memory_held_reads_other_processes_memory_on_this_jobs_gpus(tmp_path, monkeypatch):
    called = fake_nvidia_smi(tmp_path, monkeypatch, f"1234, 2048\n{os.getpid()}, 512\n5678, 100\n", "0,1")
    assert ev.gpu_memory_held() == 2148 and "--id=0,1" in called.read_text()


def test_gpu_memory_held_reads_none_held_from_no_compute_apps(tmp_path, monkeypatch):
    fake_nvidia_smi(tmp_path, monkeypatch, "")
    assert ev.gpu_memory_held() == 0


@pytest.mark.parametrize(("output", "visible"), [
    ("1234, [N/A]\n", None),  # the driver does not say
    ("1234, 2048\n", "MIG-5c8e3c4a-9d1e-5b2f-8a7c-0e6f1d2c3b4a"),  # a MIG instance: unfiltered, other jobs' GPUs
    (None, None),  # no nvidia-smi: ROCm, a CPU
])
def test_gpu_memory_held_is_none_where_it_cannot_tell(tmp_path, monkeypatch, output, visible):
    fake_nvidia_smi(tmp_path, monkeypatch, output, visible)
    assert ev.gpu_memory_held() is None


def test_gpu_memory_in_use_with_no_process_listed_cannot_tell(tmp_path, monkeypatch):
    """In a container without the host's process namespace nvidia-smi lists no compute process; a previous
    server's 60 GiB still in use must read as 'cannot tell', not as free GPUs (which would make an out-of-memory
    start the drafter's at once)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    script = bin_dir / "nvidia-smi"
    script.write_text('#!/bin/sh\ncase "$1" in --query-gpu=*) printf "61440\\n3\\n" ;; esac\n')
    script.chmod(0o755)
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    assert ev.gpu_memory_held() is None
    script.write_text('#!/bin/sh\ncase "$1" in --query-gpu=*) printf "3\\n5\\n" ;; esac\n')
    assert ev.gpu_memory_held() == 0


def test_the_gate_serves_again_an_engine_killed_once_and_records_one_killed_every_time(monkeypatch):
    """The export gate's serving goes through the same retries as a grid cell: killed once, served again and
    measured; killed at each try, the family's failure with its cause (not a gate job that fails every rerun)."""
    monkeypatch.setattr(ev, "RETRY_WAIT_S", 0)
    tries = []

    def killed_until(n: int):
        def attempt() -> None:
            tries.append(1)
            if len(tries) < n:
                raise ev.KilledWhileServing("its log shows the engine process killed", "engine core died")
        return attempt

    assert ev.killed_every_try(killed_until(2), "the eagle3 gate") is None and len(tries) == 2
    tries.clear()
    why = ev.killed_every_try(killed_until(ev.START_TRIES + 1), "the eagle3 gate")
    assert why.startswith("its engine killed by a signal while serving") and len(tries) == ev.START_TRIES


def test_a_try_killed_midway_is_served_again_whole_without_its_points_twice(tmp_path, fake_grid, monkeypatch):
    """The engine killed at concurrency 4 after concurrency 2 was measured: the next try measures the cell again
    on a fresh server, and the record holds each point once (the first try's points dropped, not kept twice)."""
    import httpx

    grid = ev.Grid({"held": [Prompt("a", ["hi"])]}, [0.0], 32, [2, 4], False, "vllm")
    start, calls = starts(tmp_path, [], dies_with=TAILS[srv.ENGINE_KILLED], dying_starts=1)

    def runs_at(base_url, model, sets, temperatures, max_tokens, seeded, concurrency, *args, **kwargs):
        if base_url == "dies" and concurrency == 4:
            raise httpx.RemoteProtocolError("Server disconnected without sending a response.")
        return [{"set": "held", "temperature": 0.0, "prompts": 1, "output_tok_s": 50.0, "held": True}]

    monkeypatch.setattr(ev, "runs_at", runs_at)
    baseline = [{"concurrency": c, "runs": [{"output_tok_s": 40.0, "held": True}]} for c in (2, 4)]
    measured = ev.measure_cells(grid, "m", baseline, {("finetuned", 3): start})["cells"]
    assert len(calls) == 2 and [c["concurrency"] for c in measured] == [2, 4], measured
    assert not any("failed" in c for c in measured)
