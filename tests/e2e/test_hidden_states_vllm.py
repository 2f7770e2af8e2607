"""Hidden-state extraction through a real vLLM-CPU server whose storage is slow and flaky.

The connector writes each row at the engine step after the response; on a loaded engine or volume
that takes far longer than the 10 s speculators' client allows. Here every write takes 12 s and
the first one fails: every row must still be stored, the failed one after a retry.
"""

from __future__ import annotations

import asyncio
import logging

import pytest

from draftsmith.core import compute
from draftsmith.generation.server import ServerSpec, managed_server
from draftsmith.hidden_states import extract as hs
from draftsmith.hidden_states.store import open_store
from tests.conftest import REPO

pytestmark = pytest.mark.e2e
ROWS = [[1, 9690, 28, 1300, 314, 5039, 30] * (i + 1) for i in range(3)]


def test_slow_and_failing_writes_are_waited_for_and_retried(target_dir, tmp_path, caplog):
    staging = hs.staging_folder(str(tmp_path / "scratch"), tmp_path / "store", "d")
    flags = hs.vllm_server_configs([2, 15, 27], 30, staging,
                                   connector=("SlowHiddenStatesConnector", "tests.sim.slow_connector"))
    spec = ServerSpec(model=str(target_dir), max_model_len=512, extra_args=["--enforce-eager"],
                      env={"VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONPATH": str(REPO),
                           "DRAFTSMITH_TEST_WRITE_DELAY_S": "12", "DRAFTSMITH_TEST_FAILED_WRITES": "1"},
                      startup_timeout_s=600, dtype=compute.choose().dtype, **flags)
    store = open_store(tmp_path / "store", "fp", "shards", shard_mb=1)
    policy = hs.ExtractionPolicy(concurrency=3, request_timeout_s=120, max_attempts=2, write_wait_s=60,
                                 slow_row_s=8)
    caplog.set_level(logging.WARNING, logger="draftsmith.hidden_states.extract")
    with managed_server(spec, tmp_path / "server.log") as server, store.writer() as writer:
        failed = asyncio.run(hs.extract_vllm(server.base_url, list(enumerate(ROWS)), writer, policy,
                                             lambda tokens: tokens * 4616))
    assert failed == {}
    assert store.done(ROWS) == {0, 1, 2}
    assert store.read(2)["hidden_states"].shape == (21, 4, 576)
    messages = [r.getMessage() for r in caplog.records]
    assert sum("attempt 1 of 2 failed: FileNotFoundError" in m for m in messages) == 1
    assert sum("its file took" in m for m in messages) >= 3  # slow rows are logged, not fatal
    assert not list(staging.iterdir())  # every staged file was packed and removed
