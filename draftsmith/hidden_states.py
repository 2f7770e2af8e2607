"""Extract the target's hidden states for every tokenized row into a :mod:`draftsmith.hs_store`.

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
import json
import logging
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from tqdm import tqdm

from draftsmith.atomic import write_json
from draftsmith.hs_store import HiddenStateStore, Writer
from draftsmith.plan import bytes_per_token

log = logging.getLogger(__name__)

def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's usual choice: an early, a middle and a late layer."""
    return [2, num_layers // 2, num_layers - 3]


def choose_aux_layers(configured: list[int] | None, num_layers: int, pretrained_check: Path | None) -> list[int]:
    """The one place the layers are decided: configured, else the warm-start drafter's, else EAGLE-3's."""
    if configured:
        return list(configured)
    if pretrained_check is not None:
        return list(json.loads(pretrained_check.read_text())["aux_layers"])
    return default_aux_layers(num_layers)


def estimate_bytes(total_tokens: int, num_slots: int, hidden_size: int) -> int:
    return total_tokens * bytes_per_token(hidden_size, num_slots)


def check_disk(folder: Path, need: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    log.info("hidden states need about %.1f MiB; %.1f MiB free at %s", need / 2**20, free / 2**20, folder)
    if need > free * 0.95:
        raise OSError(f"hidden states need about {need / 2**30:.2f} GiB but only {free / 2**30:.2f} GiB is free "
                      f"at {folder}; free space or point results/ at a larger disk")


def read_rows(table_path: Path) -> list[list[int]]:
    return pq.read_table(table_path, columns=["input_ids"]).column("input_ids").to_pylist()


def write_manifest(store: HiddenStateStore, rows: list[list[int]], out: Path, **facts) -> dict:
    """The manifest of a complete store; refuses one with rows missing."""
    missing = sorted(set(range(len(rows))) - store.done(rows))
    if missing:
        raise RuntimeError(f"{store.folder}: {len(missing)} rows have no valid hidden states (first: {missing[:5]})")
    manifest = {**facts, "fingerprint": store.fingerprint, "rows": len(rows), "tokens": sum(map(len, rows)),
                **store.describe()}
    write_json(out, manifest)
    return manifest


# --- transformers backend -------------------------------------------------------------------

def extract_transformers(model_dir: str, todo: list[tuple[int, list[int]]], writer: Writer,
                         aux_layers: list[int], threads: int) -> None:
    import torch
    from transformers import AutoModelForCausalLM

    torch.set_num_threads(threads)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.bfloat16).eval()
    layers = model.model.layers
    captured: dict[str, torch.Tensor] = {}
    # hidden_states[k] from transformers is the output of decoder layer k-1, but the final slot
    # must be the last layer's output *before* the final norm, which only a hook sees.
    hook = layers[-1].register_forward_hook(lambda _m, _i, out: captured.__setitem__(
        "last", out[0] if isinstance(out, tuple) else out))
    try:
        with torch.inference_mode():
            for row, tokens in tqdm(todo, desc="hidden states", mininterval=2.0):
                ids = torch.tensor([tokens])
                out = model.model(input_ids=ids, output_hidden_states=True)
                slots = [out.hidden_states[k][0] for k in aux_layers] + [captured["last"][0]]
                writer.write(row, torch.stack(slots, dim=1).to(torch.bfloat16), ids[0])
    finally:
        hook.remove()


# --- vLLM backend ---------------------------------------------------------------------------

def vllm_server_configs(aux_layers: list[int], num_layers: int, staging: Path) -> dict:
    """The two engine flags that turn a vLLM server into a hidden-state extractor."""
    return {
        "speculative_config": {"method": "extract_hidden_states", "num_speculative_tokens": 1,
                               "draft_model_config": {"hf_config": {
                                   "eagle_aux_hidden_state_layer_ids": [*aux_layers, num_layers]}}},
        "kv_transfer_config": {"kv_connector": "CpuHiddenStatesConnector",
                               "kv_connector_module_path": "draftsmith.hs_connector", "kv_role": "kv_producer",
                               "kv_connector_extra_config": {"shared_storage_path": str(staging.resolve())}},
    }


async def extract_vllm(base_url: str, todo: list[tuple[int, list[int]]], writer: Writer, concurrency: int,
                       request_timeout_s: float, max_retries: int) -> None:
    import openai
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import generate_hidden_states_async, wait_for_lock_async

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    model = (await client.models.list()).data[0].id
    slots = asyncio.Semaphore(concurrency)
    writing = asyncio.Lock()  # a shard writer is not thread-safe
    bar = tqdm(total=len(todo), desc="hidden states", mininterval=2.0)

    async def one(row: int, tokens: list[int]) -> None:
        async with slots:
            path, _ = await generate_hidden_states_async(client, model, {"input_ids": tokens},
                                                         timeout=request_timeout_s, max_retries=max_retries)
        if Path(path + ".lock").exists():
            await wait_for_lock_async(path + ".lock")
        states = await asyncio.to_thread(load_file, path)
        check_hidden_states(states, tokens)
        async with writing:
            await asyncio.to_thread(writer.write, row, states["hidden_states"], states["token_ids"])
        os.unlink(path)
        bar.update(1)

    try:
        await asyncio.gather(*(one(row, tokens) for row, tokens in todo))
    finally:
        bar.close()
        await client.close()
