"""The GPU path in one short run, for the GPU machine this project can borrow (or any CUDA machine).

    benchmarks/gpu_check.sh [--cpu] [--out DIR]

That machine is bare (Python 3.12, torch for CUDA, transformers; no vLLM, no network) and lent for
15 minutes, a start included: the check must tell everything in one run of at most 6 minutes. It
builds its own tiny targets with transformers' config classes and runs draftsmith's own code, each
step in a process of its own with its own time limit (one failure never hides the next), stops
starting steps once its budget is spent, and writes every result, phase timing and each step's peak
GPU memory to ``gpu_check.json``:

1. ``extract_small`` / ``extract_large``: hidden states with the transformers backend at hidden 1,024
   on rows of mixed lengths (batches padded) and at a Qwen3-8B width (hidden 4,096, vocab 151,936),
   against a bare forward pass of the same batches and a raw write + fsync of the same bytes to the same
   disk; the pinned host memory at its peak and the batch's stored-layer buffer; the small one's states
   against the CPU's;
2. ``probe``: what ``train.loss_implementation: auto`` and ``train.compile: auto`` choose on this GPU;
3. ``train_eagle3``: draftsmith's trainer under torchrun as a user's run gets it (the probe's choice),
   with its phases, and each epoch replayed on the validation rows as a server drafts and verifies (the
   predicted served τ that chooses the checkpoint); ``speculators_loop``: speculators' own loop on the
   same data and arguments;
4. ``train_dflash`` / ``train_dspark``: each block family's probe and a few steps, each epoch replayed
   as a server drafts its block;
5. ``train_long_compiled`` / ``train_long_uncompiled``: EAGLE-3 at a user's lengths (``total_seq_len``
   8,192, 3 test-time steps) on the Qwen3-8B-wide states, compiled (FlexAttention) and not (sdpa);
6. ``export``: every trained family's export, loaded back; whether EAGLE-3's trained draft head moved.

They run in the order of :data:`STEPS` (riskiest first), not of this list.

``--cpu`` runs the same steps on the CPU with small sizes (CI does, with vLLM not importable), so
the check cannot rot; there the fused loss and compilation are not run (Triton GPU kernels; speculators
compiles only on CUDA). The script exits 1 when a step that ran broke; each step's error is in the JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Sizes: big enough on a GPU that the kernels, not Python, set the pace; small on a CPU. Rows of the
# small size are of mixed lengths (tokens/4 to tokens): batches are padded, as users' are.
SIZES = {
    "gpu": {"small": {"hidden": 1024, "layers": 8, "heads": 16, "vocab": 32000, "rows": 64, "tokens": 1024},
            "large": {"hidden": 4096, "layers": 4, "heads": 32, "vocab": 151936, "rows": 64, "tokens": 2048}},
    "cpu": {"small": {"hidden": 128, "layers": 4, "heads": 4, "vocab": 4096, "rows": 16, "tokens": 128},
            "large": {"hidden": 256, "layers": 4, "heads": 4, "vocab": 8192, "rows": 8, "tokens": 256}},
}
AUX_LAYERS = [1, 2, 3]
# No step starts once the check has run this long: with the last step's limit and the machine's own start,
# the lent GPU's 6 minutes. The riskiest paths go first, so that a slow step (a first compilation can take
# its whole limit) leaves out the least: the uncompiled user-length step (FlexAttention uncompiled would
# hold every score there), then the block families' probes and training, EAGLE-3 as the probe chooses, the
# export, the compiled user-length step and speculators' own loop.
BUDGET_S = {"gpu": 210, "cpu": 1500}
# (step, the steps it needs, time limit in seconds on a GPU / on a CPU)
STEPS = [("extract_small", (), 60, 300), ("extract_large", (), 60, 300), ("probe", (), 60, 120),
         ("train_long_uncompiled", ("extract_large",), 60, 400), ("train_dflash", ("extract_small",), 80, 400),
         ("train_dspark", ("extract_small",), 80, 400), ("train_eagle3", ("extract_small",), 100, 400),
         ("export", (), 40, 120), ("train_long_compiled", ("extract_large",), 100, 60),
         ("speculators_loop", ("extract_small",), 60, 400)]
TRAINED = ("train_eagle3", "train_dflash", "train_dspark")  # the steps whose checkpoints the export takes
MASK_TOKEN = 1  # below the check's token ids (10 and up): never in the data, as a block drafter's mask must be


def say(message: str) -> None:
    print(f"gpu_check: {message}", flush=True)


def build_target(dest: Path, size: dict, device: str) -> Path:
    """A random-weight Qwen3 of ``size``, initialised on ``device`` (seconds on a GPU even at 2B)."""
    import torch
    import transformers

    if (dest / "config.json").exists():
        return dest
    config = transformers.Qwen3Config(vocab_size=size["vocab"], hidden_size=size["hidden"],
                                      intermediate_size=4 * size["hidden"], num_hidden_layers=size["layers"],
                                      num_attention_heads=size["heads"], num_key_value_heads=size["heads"] // 4,
                                      head_dim=size["hidden"] // size["heads"], max_position_embeddings=4096,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    with torch.device(device):
        model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16)
    model.save_pretrained(dest)
    return dest


def make_rows(size: dict, mixed: bool) -> list[list[int]]:
    """Random token ids; ``mixed``: each row of its own length, from a quarter of ``tokens`` to all of it."""
    import torch

    generator = torch.Generator().manual_seed(1)
    rows = torch.randint(10, size["vocab"], (size["rows"], size["tokens"]), generator=generator).tolist()
    if not mixed:
        return rows
    shortest = size["tokens"] // 4
    return [ids[:shortest + (i * 7919) % (size["tokens"] - shortest + 1)] for i, ids in enumerate(rows)]


def raw_write_s(folder: Path, nbytes: int) -> float:
    """Seconds to write ``nbytes`` and fsync them, in the folder the store writes to."""
    chunk = memoryview(os.urandom(64 << 20))
    started = time.perf_counter()
    fd = os.open(folder / "raw.bin", os.O_WRONLY | os.O_CREAT | os.O_TRUNC)
    try:
        left = nbytes
        while left:
            left -= os.write(fd, chunk[:min(left, len(chunk))])
        os.fsync(fd)
    finally:
        os.close(fd)
        (folder / "raw.bin").unlink()
    return time.perf_counter() - started


def extract(out: Path, size_name: str, device: str, size: dict | None = None) -> dict:
    """draftsmith's transformers backend into a shard store, beside a bare forward pass of the same
    (padded) batches and a raw write of the same bytes; the pinned host memory the writer staged rows
    in, at its peak, and the stored-layer buffer of the largest batch by the code's own accounting."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.core import compute
    from draftsmith.hidden_states import extract as hs
    from draftsmith.hidden_states.store import ShardStore, fingerprint

    size = size or SIZES["cpu" if device == "cpu" else "gpu"][size_name]
    started = time.perf_counter()
    target = build_target(out / f"target_{size_name}", size, device)
    build_s = time.perf_counter() - started
    rows = make_rows(size, mixed=size_name == "small")
    dtype = compute.choose("auto").dtype
    tokens = sum(map(len, rows))
    started = time.perf_counter()
    store = ShardStore(out / f"hidden_states_{size_name}", fingerprint({"target": size_name}, AUX_LAYERS,
                                                                        size["layers"], "transformers"))
    started = time.perf_counter()
    with store.writer() as writer:
        hs.extract_transformers(str(target), list(enumerate(rows)), writer, AUX_LAYERS, os.cpu_count() or 1, dtype,
                                device=device)
    extract_s = time.perf_counter() - started
    sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
    started = time.perf_counter()  # the load the extraction did too: measured here, taken out of its time
    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval().to(device)
    sync()
    load_s = time.perf_counter() - started
    extract_s = max(extract_s - load_s, 1e-9)
    batches = hs.batches(list(enumerate(rows)), 8192)
    with torch.inference_mode():
        padded = [torch.tensor([ids + [0] * (len(batch[0][1]) - len(ids)) for _, ids in batch], device=device)
                  for batch in batches]
        model.model(input_ids=padded[0][:1])  # warm-up
        sync()
        started = time.perf_counter()
        for ids in padded:
            model.model(input_ids=ids, output_hidden_states=True)
        sync()
        bare_s = time.perf_counter() - started
    stored = store.describe()["bytes"]
    write_s = raw_write_s(store.folder, stored)
    itemsize = getattr(torch, dtype).itemsize
    result = {"hidden": size["hidden"], "vocab": size["vocab"], "layers": size["layers"], "rows": len(rows),
              "tokens": tokens, "row_lengths": [min(map(len, rows)), max(map(len, rows))], "dtype": dtype,
              "build_s": round(build_s, 1), "load_s": round(load_s, 1), "stored_bytes": stored,
              "extract_tok_s": round(tokens / extract_s), "bare_forward_tok_s": round(tokens / bare_s),
              "raw_write_tok_s": round(tokens / write_s), "raw_write_gb_s": round(stored / write_s / 1e9, 2),
              "padded_tokens": sum(len(b) * len(b[0][1]) for b in batches),
              "batch_states_bytes": max(hs.batch_states_bytes(len(b) * len(b[0][1]), size["hidden"],
                                                              len(AUX_LAYERS) + 1, itemsize) for b in batches),
              "pinned_pool_bytes": writer.pool.capacity if writer.pool else 0,
              "pinned_peak_bytes": writer.pool.peak if writer.pool else 0}
    if device.startswith("cuda"):  # torch's own pinned allocator: anything staged outside the pool shows here
        stats = torch.cuda.host_memory_stats()
        result["host_allocator_peak_bytes"] = stats.get("allocated_bytes.all.peak", stats.get("reserved_bytes.peak"))
    # The goals (issue 37): at least 0.8x the slower of forward and write where they overlap (a GPU), and
    # 0.8x the two one after the other (a CPU computes the forward and writes on the same cores).
    result["ratio"] = round(result["extract_tok_s"] / min(result["bare_forward_tok_s"], result["raw_write_tok_s"]), 3)
    result["ratio_vs_forward_plus_write"] = round((bare_s + write_s) / extract_s, 3)
    if size_name == "small":
        result["against_cpu"] = against_cpu(target, rows, store, device)
    result["data"] = {k: str(v) for k, v in training_data(rows, store, out / f"data_{size_name}",
                                                          size["vocab"]).items()}
    return result


def against_cpu(target: Path, rows: list[list[int]], store, device: str) -> str:
    """The first rows again on the CPU in fp32: what the device stored must be the same states."""
    import torch

    from draftsmith.hidden_states import extract as hs

    class Keep:
        def __init__(self):
            self.states = {}

        def write(self, row, hidden_states, token_ids):
            self.states[row] = hidden_states.float()

    cpu = Keep()  # the longest row and a shorter one, which the device computed padded
    hs.extract_transformers(str(target), [(0, rows[0]), (1, rows[1])], cpu, AUX_LAYERS, os.cpu_count() or 1,
                            "float32", device="cpu")
    worst = 1.0
    for row, expected in cpu.states.items():
        stored = store.read(row)["hidden_states"].float()
        worst = min(worst, torch.nn.functional.cosine_similarity(stored.flatten(0, 1), expected.flatten(0, 1),
                                                                 dim=-1).min().item())
    if worst < 0.99:
        raise AssertionError(f"hidden states on {device} differ from the CPU's (min cosine {worst:.4f})")
    return f"min cosine similarity {worst:.4f} over {len(cpu.states)} rows x {len(AUX_LAYERS) + 1} layers"


def training_data(rows: list[list[int]], store, folder: Path, vocab: int) -> dict:
    """The merged table, the data folder speculators reads and the vocabulary mapping, as the workflow
    writes them (draftsmith's own functions), in ``folder``."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.data import vocab as vb
    from draftsmith.data.merge import TRAIN, VALIDATION, train_ratio
    from draftsmith.hidden_states.store import write_locations
    from draftsmith.training import train as tr

    folder.mkdir(parents=True, exist_ok=True)
    n_train = len(rows) - max(2, len(rows) // 8)
    merged = folder / "merged.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"input_ids": ids, "loss_mask": [0] * 8 + [1] * (len(ids) - 8), "seq_len": len(ids), "dataset": "check",
         "source_row": i, "split": TRAIN if i < n_train else VALIDATION} for i, ids in enumerate(rows)]), merged)
    data_dir = folder / "data"
    tr.write_dataset(merged, data_dir, list(range(len(rows))))
    write_locations(data_dir, store.locations(list(range(len(rows)))))
    vb.build(merged, min(2048, vocab), vocab, folder / "d2t.npy", folder / "t2d.npy", folder / "vocab.json")
    return {"folder": folder, "data_dir": data_dir, "ratio": train_ratio(n_train, len(rows)),
            "trained_tokens": sum(len(ids) for ids in rows[:n_train])}


TRAIN_CFG = {"num_layers": 1, "epochs": 2, "lr": 3e-4, "optimizer": "adamw", "weight_decay": 0.0, "scheduler": "none",
             "warmup_steps": None, "warmup_ratio": None, "total_seq_len": 2048, "ttt_steps": 3,
             "ttt_step_loss_decay": 1.0, "seed": 0, "max_steps": None, "architecture": "eagle3", "fc_norm": False,
             "draft_arch": "llama", "loss_fn": "kl_div", "train_lm_head": True}
# A block family as a user's config leaves it (loss and layers to speculators' recipe), with a small block
# and one layer so a few steps take seconds.
BLOCK_CFG = {"num_layers": 1, "block_size": 8, "mask_token_id": None, "loss_fn": None}
# A user's lengths (the schema's defaults): 8,192 tokens a step, EAGLE-3's 3 test-time steps; a few steps.
LONG = {"gpu": {"total_seq_len": 8192, "max_steps": 8}, "cpu": {"total_seq_len": 1024, "max_steps": 2}}
# The training steps: (family, the extraction whose data it reads, torch.compile setting, user's lengths).
TRAINING = {"train_eagle3": ("eagle3", "small", "auto", False), "speculators_loop": ("eagle3", "small", "auto", False),
            "train_dflash": ("dflash", "small", "auto", False), "train_dspark": ("dspark", "small", "auto", False),
            "train_long_compiled": ("eagle3", "large", "on", True),
            "train_long_uncompiled": ("eagle3", "large", "off", True)}

SPECULATORS_LOOP = """import sys
from draftsmith.hidden_states import store  # noqa: F401 - the shard layout's reader, nothing else of draftsmith
from draftsmith.training.speculators_patches import adapt_for_cpu
from speculators.train import cli
from speculators.train.config import TrainConfig
if __name__ == "__main__":  # dataloader workers re-import this file
    adapt_for_cpu()  # a no-op with an accelerator; on a CPU speculators' loop cannot run without it
    cli.main(TrainConfig.resolve(sys.argv[1:]))
"""


def with_repo_on_path() -> dict:
    """The environment for a subprocess: PYTHONPATH kept (the carried wheels are on it), the repo added."""
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}


def settings(family: str, long: dict | None) -> dict:
    """One family's training settings as scripts/train.py gets them (families.settings' shape)."""
    from draftsmith.training import families

    cfg = {**TRAIN_CFG, **(long or {})}
    if family == families.DEFAULT_FAMILY:
        return cfg
    return {**{k: cfg[k] for k in families.SHARED_KEYS if k in cfg}, **BLOCK_CFG, "epochs": 1, "max_steps": 6,
            "family": family}


def train(out: Path, step: str, device: str, processes: int) -> dict:
    """draftsmith's trainer under torchrun for ``step``'s family, lengths and compilation, the probe
    choosing what ``auto`` leaves open (as scripts/train.py does); or speculators' own loop on the same
    arguments."""
    from draftsmith.core import compute, platform
    from draftsmith.training import probe
    from draftsmith.training import train as tr

    family, size, compile_setting, user_lengths = TRAINING[step]
    if compile_setting == "on" and not platform.probes_trainer(device):
        raise NotImplementedError("not run on a CPU: speculators compiles only on CUDA")
    cfg = settings(family, LONG["cpu" if device == "cpu" else "gpu"] if user_lengths else None)
    data = json.loads((out / "steps" / f"extract_{size}.json").read_text())["result"]["data"]
    folder = Path(data["folder"])
    choice = probe.choose({"loss_implementation": "auto", "compile": compile_setting}, cfg, device)
    dtype = compute.choose("auto", training=True).dtype
    run_dir = out / step
    argv = tr.speculators_args(cfg, verifier=str(out / f"target_{size}"), data_dir=Path(data["data_dir"]),
                               save_dir=run_dir / "checkpoints", d2t=folder / "d2t.npy", t2d=folder / "t2d.npy",
                               aux_layers=AUX_LAYERS, train_ratio=float(data["ratio"]), device=device,
                               log_dir=run_dir / "logs", num_workers=1, hidden_states_backend="draftsmith",
                               dtype=dtype, loss_implementation=choice.loss_implementation, compile_=choice.compile,
                               mask_token_id=None if family == "eagle3" else MASK_TOKEN)
    result: dict = {"family": family, "dtype": dtype, "trainer": choice.as_dict(), "processes": processes,
                    "total_seq_len": cfg["total_seq_len"],
                    "draft_attention": argv[argv.index("--draft-attn-impl") + 1]}
    started = time.perf_counter()
    if step == "speculators_loop":
        loop = out / "speculators_loop.py"
        loop.write_text(SPECULATORS_LOOP)
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                        f"--nproc-per-node={processes}", str(loop), *[a for a in argv if a not in tr.OWN_FLAGS]],
                       check=True, env=with_repo_on_path())
    else:
        validation = tr.train_under_torchrun(processes, run_dir / "validation.jsonl", argv, os.cpu_count() or 1)
        result["phases"] = json.loads(tr.phases_file(run_dir / "validation.jsonl").read_text())
        result["simulated_tau"] = [round(tr.simulated_tau(e), 4) for e in validation]
    wall = time.perf_counter() - started
    result["wall_s"] = round(wall, 1)
    if not cfg.get("max_steps"):  # whole epochs: their tokens over the wall time
        result["tok_s"] = round(cfg["epochs"] * int(data["trained_tokens"]) / wall)
    if step in TRAINED:  # timed apart: speculators' loop, which tok_s is set beside, replays nothing
        result.update(replayed(out, size, validation, run_dir, cfg, device))
        result["checkpoint"] = str(tr.choose_checkpoint(run_dir / "checkpoints", validation)[0])
    return result


# Answers as users sample them (Qwen3's own settings): the replay computes each step's expected acceptance on
# the device, through the target's whole-vocabulary head, top-k and top-p.
USERS_SAMPLING = {"temperature": 0.6, "top_k": 20, "top_p": 0.95}


def replayed(out: Path, size_name: str, validation: list[dict], run_dir: Path, cfg: dict, device: str) -> dict:
    """Each epoch's predicted served τ (draftsmith.training.replay, as scripts/train.py runs it) on the check's
    validation rows and stored states, their answers taken as sampled (:data:`USERS_SAMPLING`), on ``device``,
    and its time. A replay that failed is the step's
    ``failed`` (the workflow falls back to the simulated τ, which would hide it here); the checkpoint stays
    for the export step."""
    from draftsmith.hidden_states.store import ShardStore, fingerprint
    from draftsmith.training import replay
    from draftsmith.training import train as tr

    size = SIZES["cpu" if device == "cpu" else "gpu"][size_name]
    started = time.perf_counter()
    store = ShardStore(out / f"hidden_states_{size_name}",
                       fingerprint({"target": size_name}, AUX_LAYERS, size["layers"], "transformers"))
    replay.predict_epochs(validation, tr.epoch_checkpoints(run_dir / "checkpoints"),
                          out / f"data_{size_name}" / "merged.parquet", {"check": store}, set(),
                          out / f"target_{size_name}", [cfg.get("ttt_steps")], device, {"check": USERS_SAMPLING})
    failed = [e["predicted_served_failed"] for e in validation if "predicted_served_failed" in e]
    return {"replay_s": round(time.perf_counter() - started, 1), "replay_sampling": USERS_SAMPLING,
            **({"failed": f"the replay failed: {failed[0]}"} if failed else
               {"predicted_served_tau": [round(e["predicted_served"]["tokens_per_step"], 4) for e in validation],
                "replay_expected": all(e["predicted_served"]["exactness"].get("sampled", {}).get("expected")
                                       for e in validation)})}


def export(out: Path) -> dict:
    """Every trained family's export as vLLM reads it, loaded back (EAGLE-3 into speculators' model); and
    whether EAGLE-3's draft LM head left the verifier's rows it started from (train_lm_head)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    from draftsmith.training.export import export_vllm

    records = {step: json.loads((out / "steps" / f"{step}.json").read_text()) for step in TRAINED
               if (out / "steps" / f"{step}.json").exists()}
    finished = {r["result"]["family"]: Path(r["result"]["checkpoint"]) for r in records.values()
                if (r.get("result") or {}).get("checkpoint")}
    if not finished:
        raise NotImplementedError("no training step finished")
    target = out / "target_small"
    result: dict = {}
    for family, checkpoint in finished.items():
        drafter = out / "drafters" / family
        drafter.mkdir(parents=True, exist_ok=True)
        started = time.perf_counter()
        config = export_vllm(checkpoint, drafter / "model.safetensors", drafter / "config.json",
                             verifier_ref=str(target))
        result[family] = {"export_s": round(time.perf_counter() - started, 1),
                          "type": config.get("speculators_model_type", "eagle3")}
    if "eagle3" in finished:
        drafter = out / "drafters" / "eagle3"
        model = Eagle3DraftModel.from_pretrained(str(drafter))
        d2t = torch.from_numpy(np.load(out / "data_small" / "d2t.npy"))
        start = load_file(str(target / "model.safetensors"))["lm_head.weight"][torch.arange(len(d2t)) + d2t]
        trained = load_file(str(drafter / "model.safetensors"))["lm_head.weight"]
        result["eagle3"].update(parameters=sum(p.numel() for p in model.parameters()), fc=list(model.fc.weight.shape),
                                head_moved=(trained.float() - start.float()).abs().max().item())
    return result


def run_step(step: str, out: Path, device: str, processes: int) -> dict:
    if step.startswith("extract_"):
        return extract(out, step.removeprefix("extract_"), device)
    if step == "probe":
        from draftsmith.training import probe

        started = time.perf_counter()
        return {**probe.choose({"loss_implementation": "auto", "compile": "auto"}, TRAIN_CFG, device).as_dict(),
                "seconds": round(time.perf_counter() - started, 1)}
    if step in TRAINING:
        return train(out, step, device, processes)
    return export(out)


def step_main(step: str, out: Path, device: str, processes: int) -> int:
    """One step in this process: its result, or its error, in ``steps/<step>.json``."""
    from draftsmith.core.atomic import write_json

    started = time.perf_counter()
    try:
        result = run_step(step, out, device, processes)  # a step that failed after its work keeps its result
        record = {"ok": "failed" not in result, "result": result,
                  **({"error": result["failed"]} if "failed" in result else {})}
    except NotImplementedError as err:
        record = {"ok": None, "not_run": str(err)}
    except Exception as err:
        import traceback

        traceback.print_exc()
        record = {"ok": False, "error": f"{type(err).__name__}: {err}"[:2000]}
    record["seconds"] = round(time.perf_counter() - started, 1)
    write_json(out / "steps" / f"{step}.json", record)
    return 0 if record["ok"] is not False else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run every step on the CPU (what CI runs)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--processes", type=int, default=None, help="training ranks (default: 1 per GPU, 2 on a CPU)")
    parser.add_argument("--step", choices=[name for name, *_ in STEPS], help=argparse.SUPPRESS)
    args = parser.parse_args()
    import tempfile

    import torch

    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_check."))
    (out / "steps").mkdir(parents=True, exist_ok=True)
    if not args.cpu and not torch.cuda.is_available():
        say("no CUDA device here; run with --cpu for the same steps on the CPU")
        return 3
    device = "cpu" if args.cpu else "cuda"
    processes = args.processes or (2 if args.cpu else torch.cuda.device_count())
    if args.step:
        return step_main(args.step, out, device, processes)
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # every process of the check, torchrun's ranks included
    from draftsmith.ops import devices

    report: dict = {"python": sys.version.split()[0], "torch": torch.__version__,
                    "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
                    "driver": devices.driver_version(), "packages": versions(), "steps": {}}
    say(f"python {report['python']}, torch {report['torch']}, device {report['device']}, NVIDIA driver "
        f"{report['driver'] or 'none'}, work folder {out}")
    budget, started = BUDGET_S["cpu" if args.cpu else "gpu"], time.monotonic()
    for step, needs, gpu_limit, cpu_limit in STEPS:
        failed = [n for n in needs if not report["steps"].get(n, {}).get("ok")]
        if failed:
            report["steps"][step] = {"ok": None, "not_run": f"needs {', '.join(failed)}"}
        elif time.monotonic() - started > budget:
            report["steps"][step] = {"ok": None, "not_run": f"the check's budget of {budget} s was spent"}
        else:
            with PeakGpuMemory() as peak:
                report["steps"][step] = run_isolated(step, out, args.cpu, processes,
                                                     cpu_limit if args.cpu else gpu_limit)
            report["steps"][step]["peak_gpu_mib"] = peak.mib
        say(f"{step}: {summary(report['steps'][step])}")
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        report["not_run"] = (f"vLLM's steps (generation, vLLM hidden states, the export gate, evaluation): {err}. "
                             "On a CPU they run in the e2e tests; on GPUs they need a machine with vLLM's CUDA wheels")
        say(f"not run here: {report['not_run']}")
    (out / "gpu_check.json").write_text(json.dumps(report, indent=1))
    say(f"done: {out / 'gpu_check.json'}")
    return 1 if any(r["ok"] is False for r in report["steps"].values()) else 0


def run_isolated(step: str, out: Path, cpu: bool, processes: int, limit_s: int) -> dict:
    """``step`` in a process of its own, ended at ``limit_s`` (its children too)."""
    command = [sys.executable, str(Path(__file__).resolve()), "--step", step, "--out", str(out),
               f"--processes={processes}", *(["--cpu"] if cpu else [])]
    started = time.perf_counter()
    proc = subprocess.Popen(command, env=with_repo_on_path(), start_new_session=True)
    try:
        proc.wait(timeout=limit_s)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        proc.wait()
        phases = out / step / "phases.json"  # where a stalled trainer had got to
        return {"ok": False, "error": f"no result within its limit of {limit_s} s", "seconds": limit_s,
                **({"phases": json.loads(phases.read_text())} if phases.exists() else {})}
    record_file = out / "steps" / f"{step}.json"
    if not record_file.exists():
        return {"ok": False, "error": f"exited with code {proc.returncode} and no result",
                "seconds": round(time.perf_counter() - started, 1)}
    return json.loads(record_file.read_text())


class PeakGpuMemory:
    """The GPUs' memory in use at its peak while a step runs (its own process and the trainer's ranks),
    sampled from nvidia-smi twice a second; None without one."""

    def __init__(self, interval_s: float = 0.5):
        import threading

        self.interval_s, self.mib = interval_s, None
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            try:
                out = subprocess.run(["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits"],
                                     capture_output=True, text=True, timeout=10)
            except (OSError, subprocess.TimeoutExpired):
                return
            if out.returncode != 0:
                return
            used = sum(int(v) for v in out.stdout.split() if v.isdigit())
            self.mib = max(self.mib or 0, used)
            if self.stop.wait(self.interval_s):
                return

    def __enter__(self) -> PeakGpuMemory:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop.set()
        self.thread.join()


def summary(record: dict) -> str:
    if record["ok"] is None:
        return f"not run ({record['not_run']})"
    if not record["ok"]:
        return f"FAILED after {record.get('seconds', 0):.0f} s: {record['error'][:300]}"
    shown = {k: v for k, v in record["result"].items() if k not in ("data", "checkpoint")}
    memory = f", peak GPU memory {record['peak_gpu_mib']} MiB" if record.get("peak_gpu_mib") is not None else ""
    return f"ok in {record['seconds']:.0f} s{memory}: {json.dumps(shown)}"


def versions() -> dict:
    from importlib.metadata import PackageNotFoundError, version

    found = {}
    for name in ("transformers", "speculators", "triton", "safetensors", "xxhash", "datasets"):
        try:
            found[name] = version(name)
        except PackageNotFoundError:
            found[name] = None
    return found


if __name__ == "__main__":
    sys.exit(main())
