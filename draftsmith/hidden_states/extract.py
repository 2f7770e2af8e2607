"""Extract the target's hidden states for every tokenized row into a :mod:`draftsmith.hidden_states.store`.

Per row: ``hidden_states`` bf16 ``[seq, 4, H]`` (three auxiliary layers, then the last decoder
layer's output before the final norm) and ``token_ids`` int64 ``[seq]``. Two backends produce it:

- ``vllm``: a managed vLLM server with ``extract_hidden_states`` and our CPU-capable connector,
  driven by speculators' own client (what users run on GPUs);
- ``transformers``: a plain forward pass with hooks (no server; handy for small targets).

Resume: a row already stored with the same token ids *and* the same fingerprint (target, layers,
backend, dtype) is kept; anything else is (re)extracted, and files of another fingerprint are
deleted first. Before any work the disk need is estimated and compared with free space.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import torch
from tqdm import tqdm

from draftsmith.core.atomic import write_json
from draftsmith.core.units import human_bytes
from draftsmith.hidden_states.store import HiddenStateStore, Writer

log = logging.getLogger(__name__)


def check_disk(folder: Path, need: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    log.info("hidden states need about %s; %s free at %s", human_bytes(need), human_bytes(free), folder)
    if need > free * 0.95:
        raise OSError(f"hidden states need about {human_bytes(need)} but only {human_bytes(free)} is free "
                      f"at {folder}; free space or point results/ at a larger disk")


def read_rows(table_path: Path) -> list[list[int]]:
    return pq.read_table(table_path, columns=["input_ids"]).column("input_ids").to_pylist()


def write_manifest(store: HiddenStateStore, rows: list[list[int]], out: Path, failed: dict[int, str],
                   **facts) -> dict:
    """The manifest of a store holding every row but the ``failed`` ones (training leaves those out)."""
    missing = sorted(set(range(len(rows))) - store.done(rows) - set(failed))
    if missing:
        raise RuntimeError(f"{store.folder}: {len(missing)} rows have no valid hidden states (first: {missing[:5]})")
    manifest = {**facts, "fingerprint": store.fingerprint, "rows": len(rows), "tokens": sum(map(len, rows)),
                "failed_rows": sorted(failed), **store.describe()}
    write_json(out, manifest)
    return manifest


# --- transformers backend -------------------------------------------------------------------

def batches(todo: list[tuple[int, list[int]]], batch_tokens: int) -> list[list[tuple[int, list[int]]]]:
    """Rows longest first, packed so that a batch's rows times its longest row stay within
    ``batch_tokens`` (a longer row goes alone): little padding, and the accelerator gets work big
    enough to keep it busy instead of one row per forward pass."""
    batch: list[tuple[int, list[int]]] = []
    out = []
    for item in sorted(todo, key=lambda item: -len(item[1])):
        if batch and (len(batch) + 1) * len(batch[0][1]) > batch_tokens:
            out.append(batch)
            batch = []
        batch.append(item)
    return [*out, batch] if batch else out


def batch_states_bytes(tokens: int, hidden: int, stored_layers: int, dtype_bytes: int = 2) -> int:
    """Device memory one batch's hidden states take beside the model's own working memory: the stored
    layers' buffer, ``[rows, longest, stored_layers, hidden]`` (``tokens`` = rows x longest, padding
    included), filled by hooks as the forward pass reaches each layer. transformers'
    ``output_hidden_states`` would keep every layer's output of the batch until the pass ends (a
    61-layer, 7,168-wide target at 8,192 tokens: 6.7 GiB, against 0.4 GiB here)."""
    return tokens * stored_layers * hidden * dtype_bytes


def capture_layers(model, aux_layers: list[int]) -> tuple[list, Callable[[int, int], torch.Tensor]]:
    """Hooks that copy the auxiliary layers' outputs and the last decoder layer's (before the final
    norm) into one ``[rows, seq, len(aux_layers) + 1, hidden]`` buffer per batch, as the forward pass
    reaches them: ``aux_layers`` ids as transformers' ``hidden_states`` tuple counts them (0: the
    embeddings; k: decoder layer k-1's output). Returns the hooks and a function that allocates the
    next batch's buffer (a new one each batch: the writer may still be reading the last)."""
    layers = model.model.layers
    sources = [model.model.embed_tokens if k == 0 else layers[k - 1] for k in aux_layers] + [layers[-1]]
    current: dict[str, torch.Tensor] = {}

    def into(slot: int):
        def hook(_module, _inputs, out):
            current["buffer"][:, :, slot].copy_(out[0] if isinstance(out, tuple) else out)
        return hook

    hooks = [source.register_forward_hook(into(slot)) for slot, source in enumerate(sources)]
    hidden, dtype = model.config.get_text_config().hidden_size, model.dtype

    def new_buffer(rows: int, seq: int) -> torch.Tensor:
        current["buffer"] = torch.empty(rows, seq, len(sources), hidden, dtype=dtype, device=model.device)
        return current["buffer"]

    return hooks, new_buffer


def extract_transformers(model_dir: str, todo: list[tuple[int, list[int]]], writer: Writer,
                         aux_layers: list[int], threads: int, dtype: str = "bfloat16",
                         trust_remote_code: bool = False, device: str | None = None,
                         batch_tokens: int = 8192) -> None:
    """Forward passes in ``dtype`` (see :mod:`draftsmith.core.compute`) on ``device`` (the job's
    accelerator where it has one: :func:`draftsmith.core.compute.device`), rows batched up to
    ``batch_tokens`` (:func:`batches`). Rows are right-padded: attention is causal, so a row's
    states never see the padding after it. Only the stored layers are kept (:func:`capture_layers`,
    :func:`batch_states_bytes`); no KV cache is built. The writer takes each row's states from the
    device without waiting for them (:mod:`draftsmith.hidden_states.store`), so the next batch computes
    while the last one is stored. One device holds the whole target: a target larger than one GPU is
    what the vLLM backend (tensor parallel) is for."""
    from transformers import AutoModelForCausalLM

    from draftsmith.core.compute import device as job_device

    device = device or job_device()
    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype),
                                                 trust_remote_code=trust_remote_code).eval().to(device)
    hooks, new_buffer = capture_layers(model, aux_layers)
    log.info("hidden states of a batch take up to %s on %s (%d stored layers)", human_bytes(batch_states_bytes(
        batch_tokens, model.config.get_text_config().hidden_size, len(aux_layers) + 1,
        model.dtype.itemsize)), device, len(aux_layers) + 1)
    bar = tqdm(total=sum(len(ids) for _, ids in todo), desc="hidden states", unit="tok", unit_scale=True,
               mininterval=2.0)
    try:
        with torch.inference_mode():
            for batch in batches(todo, batch_tokens):
                longest = len(batch[0][1])
                ids = torch.zeros(len(batch), longest, dtype=torch.int64)
                for b, (_, tokens) in enumerate(batch):
                    ids[b, :len(tokens)] = torch.tensor(tokens)
                stacked = new_buffer(len(batch), longest)
                model.model(input_ids=ids.to(device), use_cache=False)  # a cache would hold every layer's K/V
                for b, (row, tokens) in enumerate(batch):
                    writer.write(row, stacked[b, :len(tokens)], ids[b, :len(tokens)])
                bar.update(sum(len(tokens) for _, tokens in batch))
    finally:
        bar.close()
        for hook in hooks:
            hook.remove()


# --- vLLM backend ---------------------------------------------------------------------------

CONNECTOR = ("CpuHiddenStatesConnector", "draftsmith.hidden_states.connector")


def vllm_server_configs(aux_layers: list[int], num_layers: int, staging: Path,
                        connector: tuple[str, str] = CONNECTOR) -> dict:
    """The two engine flags that turn a vLLM server into a hidden-state extractor."""
    name, module = connector
    return {
        "speculative_config": {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                               "draft_model_config": {"hf_config": {
                                   "eagle_aux_hidden_state_layer_ids": [*aux_layers, num_layers]}}},
        "kv_transfer_config": {"kv_connector": name, "kv_connector_module_path": module, "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": str(staging.resolve())}},
    }


def staging_folder(configured: str | None, store_folder: Path, dataset: str) -> Path:
    """Where the server drops each row's file before it is packed into the store: node-local
    scratch when configured (``$TMPDIR`` on a cluster; variables are expanded), so every row is not
    written twice to shared storage. One folder per job, emptied first (files a killed run staged
    were never validated)."""
    base = Path(os.path.expandvars(configured)) if configured else store_folder / ".staging"
    folder = base / f"draftsmith-{dataset}" if configured else base
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


@dataclass
class ExtractionPolicy:
    """How long a row may take, and how many may fail, before the job gives up.

    The connector writes a row's file at the engine step *after* its response (a step that carries
    other rows' prefill) and the write itself scales with the row: up to ~470 MB for 8k tokens of
    a 7k-wide target with four layers. The wait therefore allows ``write_wait_s`` plus the row's
    bytes at ``write_min_mb_s``; nothing assumes a fast engine or a fast volume.
    """

    concurrency: int = 32
    request_timeout_s: float = 600.0
    max_attempts: int = 4
    write_wait_s: float = 600.0
    write_min_mb_s: float = 20.0
    slow_row_s: float = 30.0
    max_error_fraction: float = 0.01

    def write_timeout_s(self, nbytes: int) -> float:
        return self.write_wait_s + nbytes / (self.write_min_mb_s * 2**20)

    @classmethod
    def from_config(cls, cfg: dict) -> ExtractionPolicy:
        return cls(**{k: cfg[k] for k in cls.__dataclass_fields__})


class ExtractionFailed(RuntimeError):
    pass


async def wait_written(path: str, timeout_s: float) -> float:
    """Seconds until the connector released ``path``'s lock, i.e. the file is complete."""
    started = time.monotonic()
    lock = path + ".lock"
    if os.path.exists(lock):
        fd = os.open(lock, os.O_RDONLY)
        try:
            while True:
                try:
                    fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if time.monotonic() - started > timeout_s:
                        raise TimeoutError(
                            f"{path} was not written within {timeout_s:.0f} s of its response (raise "
                            "hidden_states.write_wait_s for a slow engine or volume)") from None
                    await asyncio.sleep(0.2)
        finally:
            os.close(fd)
        os.unlink(lock)
    if not os.path.exists(path):
        raise FileNotFoundError(f"{path}: the server released the row's lock without writing it (see its log)")
    return time.monotonic() - started


def _discard(path: str | None) -> None:
    for leftover in (path, path and path + ".lock", path and path + ".partial"):
        if leftover:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(leftover)


async def extract_vllm(base_url: str, todo: list[tuple[int, list[int]]], writer: Writer, policy: ExtractionPolicy,
                       row_bytes: Callable[[int], int]) -> dict[int, str]:
    """Extract every row in ``todo``; returns rows that failed every attempt, with the last reason.

    A failing row is retried (``max_attempts``) without stopping the others; the job decides what
    a number of failed rows means (:func:`check_failures`).
    """
    import openai
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import generate_hidden_states_async

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    model = (await client.models.list()).data[0].id
    slots = asyncio.Semaphore(policy.concurrency)
    writing = asyncio.Lock()  # a shard writer is not thread-safe
    failed: dict[int, str] = {}
    bar = tqdm(total=len(todo), desc="hidden states", unit="row", mininterval=2.0)

    async def attempt(row: int, tokens: list[int]) -> None:
        path = None
        try:
            async with slots:
                path, _ = await generate_hidden_states_async(client, model, {"input_ids": tokens},
                                                             timeout=policy.request_timeout_s, max_retries=0)
            waited = await wait_written(path, policy.write_timeout_s(row_bytes(len(tokens))))
            if waited > policy.slow_row_s:
                log.warning("row %d (%d tokens): its file took %.0f s after the response", row, len(tokens), waited)
            states = await asyncio.to_thread(load_file, path)
            check_hidden_states(states, tokens)
            async with writing:
                await asyncio.to_thread(writer.write, row, states["hidden_states"], states["token_ids"])
        finally:
            _discard(path)

    async def one(row: int, tokens: list[int]) -> None:
        for n in range(1, policy.max_attempts + 1):
            try:
                await attempt(row, tokens)
                bar.update(1)
                return
            except Exception as err:  # any failure of one row is that row's: retried, then counted
                reason = f"{type(err).__name__}: {err}"
                log.warning("row %d: attempt %d of %d failed: %s", row, n, policy.max_attempts, reason)
                if n < policy.max_attempts:
                    await asyncio.sleep(min(30.0, 2.0 ** n))
        failed[row] = reason

    try:
        await asyncio.gather(*(one(row, tokens) for row, tokens in todo))
    finally:
        bar.close()
        await client.close()
    return failed


def check_failures(failed: dict[int, str], total_rows: int, max_error_fraction: float, failures_file: Path) -> None:
    """Record failed rows (a rerun retries just those); fail the job past ``max_error_fraction``."""
    write_json(failures_file, {"rows": {str(k): v for k, v in sorted(failed.items())}})
    if len(failed) > max_error_fraction * total_rows:
        first = min(failed)
        raise ExtractionFailed(
            f"{len(failed)} of {total_rows} rows have no hidden states (more than max_error_fraction "
            f"{max_error_fraction}); reasons in {failures_file}, e.g. row {first}: {failed[first]}. The rows "
            "extracted are kept: a rerun extracts only the missing ones")
