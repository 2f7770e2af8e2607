"""The CPU connector with storage as slow as a loaded shared volume, and optionally flaky.

Read in the vLLM server's process: ``DRAFTSMITH_TEST_WRITE_DELAY_S`` (seconds each row's write
takes) and ``DRAFTSMITH_TEST_FAILED_WRITES`` (how many of the first writes release the row's lock
without writing its file, as a write error does).
"""

import os
import threading
import time

from draftsmith.hidden_states.connector import CpuHiddenStatesConnector

_failures_left = int(os.environ.get("DRAFTSMITH_TEST_FAILED_WRITES", "0"))
_lock = threading.Lock()


class SlowHiddenStatesConnector(CpuHiddenStatesConnector):
    def _write(self, tensors, filename, lock_fd):
        global _failures_left
        time.sleep(float(os.environ.get("DRAFTSMITH_TEST_WRITE_DELAY_S", "30")))
        with _lock:
            fail, _failures_left = _failures_left > 0, max(0, _failures_left - 1)
        if fail:
            os.close(lock_fd)
            raise OSError(f"simulated write error for {filename}")
        super()._write(tensors, filename, lock_fd)
