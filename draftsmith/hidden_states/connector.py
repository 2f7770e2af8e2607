"""A CPU-capable hidden-states connector for vLLM's ``extract_hidden_states`` path.

vLLM's ``ExampleHiddenStatesConnector`` copies the captured states out of the KV cache through
pinned memory on a CUDA stream; on vLLM-CPU that crashes on the first request
(``pin_memory=True requires a CUDA or other accelerator backend``). On CPU the KV cache already
lives in host memory, so this subclass copies synchronously (the blocks are freed once the request
is reported done) and hands the disk write to the parent's writer threads, exactly as the GPU path
does: the engine never waits for storage, and the client waits on the row's lock file, released
when the file is complete (written under a temporary name, then renamed). On a GPU the parent's
path is used unchanged.

Loaded by vLLM through ``kv_connector_module_path: draftsmith.hidden_states.connector``.
"""

from __future__ import annotations

import os

import torch
from safetensors.torch import save_file
from vllm.distributed.kv_transfer.kv_connector.v1.example_hidden_states_connector import (
    ExampleHiddenStatesConnector,
    PendingSave,
    extract_from_kv_cache,
)


class _Done:
    """Stands in for the CUDA event the parent polls: the copy out of the KV cache is complete."""

    @staticmethod
    def query() -> bool:
        return True


class CpuHiddenStatesConnector(ExampleHiddenStatesConnector):
    def _submit_async_write(self, pending: PendingSave) -> None:
        assert self._kv_cache is not None
        if self._kv_cache.device.type != "cpu":
            return super()._submit_async_write(pending)
        if not self._is_tp_rank_zero:
            return
        block_ids = torch.tensor(pending.block_ids, dtype=torch.long)
        offsets = torch.arange(self._block_size, dtype=torch.long)
        slot_mapping = (offsets.reshape(1, -1) + block_ids.reshape(-1, 1) * self._block_size).flatten()
        tensors = {"hidden_states": extract_from_kv_cache(self._kv_cache, slot_mapping,
                                                          pending.token_ids.shape[0]).clone(),
                   "token_ids": pending.token_ids.clone()}
        os.makedirs(os.path.dirname(pending.filename), exist_ok=True)
        lock_fd = self._lock_fds.pop(pending.req_id, None)
        future = self._executor.submit(self._write, tensors, pending.filename, lock_fd)
        self._req_copy_events[pending.req_id] = _Done()
        self._req_futures[pending.req_id] = future
        future.add_done_callback(lambda done, req_id=pending.req_id: self._on_write_done(req_id, done))

    def _write(self, tensors: dict[str, torch.Tensor], filename: str, lock_fd: int | None) -> None:
        """Writer thread: the file under a temporary name, renamed, then the lock released."""
        tmp = filename + ".partial"
        try:
            save_file(tensors, tmp)
            os.replace(tmp, filename)
        finally:
            if lock_fd is not None:
                os.close(lock_fd)
