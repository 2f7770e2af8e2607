"""Extract the target's hidden states for every tokenized row, in the layout speculators reads.

One file per row, ``hs_<row>.safetensors`` with ``hidden_states`` bf16 ``[seq, 4, H]`` (three
auxiliary layers, then the last decoder layer's output before the final norm) and ``token_ids``
int64 ``[seq]``. Two backends write the same thing:

- ``vllm``: a managed vLLM server with ``extract_hidden_states`` and our CPU-capable connector,
  driven by speculators' own client (what users run on GPUs);
- ``transformers``: a plain forward pass with hooks (no server; handy for small targets).

Resume: a row whose file exists, opens, and holds the row's exact token ids is kept; anything
else is (re)extracted. Files are written under a temporary name and renamed. Before any work
the disk need is estimated and compared with free space.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
from pathlib import Path

import pyarrow.parquet as pq
from safetensors import safe_open
from tqdm import tqdm

from draftsmith.atomic import write_json

log = logging.getLogger(__name__)

BYTES_PER_VALUE = 2  # bf16


def default_aux_layers(num_layers: int) -> list[int]:
    """EAGLE-3's usual choice: an early, a middle and a late layer."""
    return [2, num_layers // 2, num_layers - 3]


def hs_path(folder: Path, row: int) -> Path:
    return folder / f"hs_{row}.safetensors"


def is_done(path: Path, input_ids: list[int]) -> bool:
    try:
        with safe_open(path, framework="pt") as fh:
            return fh.get_tensor("token_ids").tolist() == list(input_ids)
    except Exception:  # missing, truncated or foreign file: extract again
        return False


def estimate_bytes(total_tokens: int, num_slots: int, hidden_size: int) -> int:
    return total_tokens * (num_slots * hidden_size * BYTES_PER_VALUE + 8)


def check_disk(folder: Path, need: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    free = shutil.disk_usage(folder).free
    log.info("hidden states need about %.1f MiB; %.1f MiB free at %s", need / 2**20, free / 2**20, folder)
    if need > free * 0.95:
        raise OSError(f"hidden states need about {need / 2**30:.2f} GiB but only {free / 2**30:.2f} GiB is free "
                      f"at {folder}; free space or point results/ at a larger disk")


def rows_to_extract(table_path: Path, folder: Path) -> tuple[list[tuple[int, list[int]]], int]:
    """Rows still missing a valid file, and the number of all rows."""
    ids = pq.read_table(table_path, columns=["input_ids"]).column("input_ids").to_pylist()
    todo = [(row, tokens) for row, tokens in enumerate(ids) if not is_done(hs_path(folder, row), tokens)]
    return todo, len(ids)


def write_manifest(folder: Path, out: Path, backend: str, aux_layers: list[int], num_layers: int,
                   hidden_size: int, table_path: Path) -> dict:
    ids = pq.read_table(table_path, columns=["input_ids"]).column("input_ids").to_pylist()
    missing = [row for row, tokens in enumerate(ids) if not is_done(hs_path(folder, row), tokens)]
    if missing:
        raise RuntimeError(f"{folder}: {len(missing)} rows have no valid hidden states (first: {missing[:5]})")
    manifest = {"backend": backend, "aux_layers": aux_layers, "final_layer": num_layers, "hidden_size": hidden_size,
                "rows": len(ids), "tokens": sum(map(len, ids)),
                "bytes": sum(hs_path(folder, r).stat().st_size for r in range(len(ids)))}
    write_json(out, manifest)
    return manifest


# --- transformers backend -------------------------------------------------------------------

def extract_transformers(model_dir: str, todo: list[tuple[int, list[int]]], folder: Path,
                         aux_layers: list[int], threads: int) -> None:
    import torch
    from safetensors.torch import save_file
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
                tensors = {"hidden_states": torch.stack(slots, dim=1).to(torch.bfloat16).contiguous(),
                           "token_ids": ids[0].to(torch.int64)}
                _save_atomic(save_file, tensors, hs_path(folder, row))
    finally:
        hook.remove()


def _save_atomic(save_file, tensors, dest: Path) -> None:
    tmp = dest.with_suffix(".partial")
    save_file(tensors, str(tmp))
    os.replace(tmp, dest)


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


async def extract_vllm(base_url: str, todo: list[tuple[int, list[int]]], folder: Path, concurrency: int,
                       request_timeout_s: float, max_retries: int) -> None:
    import openai
    from safetensors.torch import load_file
    from speculators.data_generation.offline import check_hidden_states
    from speculators.data_generation.vllm_client import generate_hidden_states_async, wait_for_lock_async

    client = openai.AsyncOpenAI(base_url=base_url, api_key="EMPTY", max_retries=0)
    model = (await client.models.list()).data[0].id
    slots = asyncio.Semaphore(concurrency)
    bar = tqdm(total=len(todo), desc="hidden states", mininterval=2.0)

    async def one(row: int, tokens: list[int]) -> None:
        async with slots:
            path, _ = await generate_hidden_states_async(client, model, {"input_ids": tokens},
                                                         timeout=request_timeout_s, max_retries=max_retries)
        if Path(path + ".lock").exists():
            await wait_for_lock_async(path + ".lock")
        check_hidden_states(await asyncio.to_thread(load_file, path), tokens)
        os.replace(path, hs_path(folder, row))
        bar.update(1)

    try:
        await asyncio.gather(*(one(row, tokens) for row, tokens in todo))
    finally:
        bar.close()
        await client.close()
