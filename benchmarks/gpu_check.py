"""The GPU path in one short run, for the GPU machine this project can borrow (or any CUDA machine).

    benchmarks/gpu_check.sh [--cpu] [--out DIR]

That machine is bare (Python 3.12, torch for CUDA 13, transformers; no vLLM, no network), so the
check builds its own tiny target with transformers' config classes and runs draftsmith's own code:

1. hidden states with the transformers backend on the GPU, against the same rows on the CPU, and
   against a bare forward pass of the same model (tok/s ratio: what extraction costs over the model);
2. speculators training under torchrun (NCCL on GPUs, gloo ranks on a CPU) in the dtype ``auto``
   picks, with the draft LM head trained, against speculators' own loop on the same data and
   arguments without draftsmith's wrappers (tok/s ratio);
3. the export vLLM loads (``Eagle3DraftModel.from_pretrained``) and whether the trained head moved.

``--cpu`` runs the same steps on the CPU (CI does, with vLLM not importable), so the check cannot
rot. Each step that cannot run here says why; the script fails only on a step that ran and broke.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

# Sizes: big enough on a GPU that the kernels, not Python, set the pace; small on a CPU.
SIZES = {"gpu": {"hidden": 1024, "layers": 8, "heads": 16, "vocab": 32000, "rows": 64, "tokens": 1024},
         "cpu": {"hidden": 128, "layers": 4, "heads": 4, "vocab": 4096, "rows": 16, "tokens": 128}}
AUX_LAYERS = [1, 2, 3]


def say(message: str) -> None:
    print(f"gpu_check: {message}", flush=True)


def missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def build_target(dest: Path, size: dict) -> Path:
    import torch
    import transformers

    config = transformers.Qwen3Config(vocab_size=size["vocab"], hidden_size=size["hidden"],
                                      intermediate_size=4 * size["hidden"], num_hidden_layers=size["layers"],
                                      num_attention_heads=size["heads"], num_key_value_heads=size["heads"] // 4,
                                      head_dim=size["hidden"] // size["heads"], max_position_embeddings=4096,
                                      tie_word_embeddings=False)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).save_pretrained(dest)
    return dest


def make_rows(size: dict) -> list[list[int]]:
    import torch

    generator = torch.Generator().manual_seed(1)
    return torch.randint(10, size["vocab"], (size["rows"], size["tokens"]), generator=generator).tolist()


def extraction(target: Path, rows: list[list[int]], out: Path, device: str) -> dict:
    """draftsmith's transformers backend into a shard store, and a bare forward pass of the same rows."""
    import torch
    from transformers import AutoModelForCausalLM

    from draftsmith.core import compute
    from draftsmith.hidden_states import extract as hs
    from draftsmith.hidden_states.store import ShardStore, fingerprint

    dtype = compute.choose("auto").dtype
    tokens = sum(map(len, rows))
    store = ShardStore(out / "hidden_states", fingerprint({"target": str(target)}, AUX_LAYERS, len(AUX_LAYERS) + 1,
                                                          "transformers"))
    started = time.perf_counter()
    with store.writer() as writer:
        hs.extract_transformers(str(target), list(enumerate(rows)), writer, AUX_LAYERS, os.cpu_count() or 1, dtype,
                                device=device)
    extract_s = time.perf_counter() - started
    model = AutoModelForCausalLM.from_pretrained(target, dtype=getattr(torch, dtype)).eval().to(device)
    with torch.inference_mode():
        model.model(input_ids=torch.tensor([rows[0]], device=device))  # warm-up, as extraction's first row is
        sync = torch.cuda.synchronize if device.startswith("cuda") else (lambda: None)
        sync()
        started = time.perf_counter()
        for ids in rows:
            model.model(input_ids=torch.tensor([ids], device=device))
        sync()
        bare_s = time.perf_counter() - started
    return {"store": store, "dtype": dtype, "tokens": tokens, "extract_tok_s": tokens / extract_s,
            "bare_tok_s": tokens / bare_s}


def against_cpu(target: Path, rows: list[list[int]], store, device: str) -> str:
    """The first rows again on the CPU in fp32: what the GPU stored must be the same states."""
    import torch

    from draftsmith.hidden_states import extract as hs

    class Keep:
        def __init__(self):
            self.states = {}

        def write(self, row, hidden_states, token_ids):
            self.states[row] = hidden_states.float()

    cpu = Keep()
    hs.extract_transformers(str(target), list(enumerate(rows[:2])), cpu, AUX_LAYERS, os.cpu_count() or 1,
                            "float32", device="cpu")
    worst = 1.0
    for row, expected in cpu.states.items():
        stored = store.read(row)["hidden_states"].float()
        worst = min(worst, torch.nn.functional.cosine_similarity(stored.flatten(0, 1), expected.flatten(0, 1),
                                                                 dim=-1).min().item())
    if worst < 0.99:
        raise AssertionError(f"hidden states on {device} differ from the CPU's (min cosine {worst:.4f})")
    return f"min cosine similarity {worst:.4f} over {len(cpu.states)} rows x {len(AUX_LAYERS) + 1} layers"


def training_data(rows: list[list[int]], store, out: Path, vocab: int) -> dict:
    """The merged table, the data folder speculators reads and the vocabulary mapping, as the workflow
    writes them (draftsmith's own functions)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from draftsmith.data import vocab as vb
    from draftsmith.data.merge import TRAIN, VALIDATION, train_ratio
    from draftsmith.hidden_states.store import write_locations
    from draftsmith.training import train as tr

    n_train = len(rows) - max(2, len(rows) // 8)
    merged = out / "merged.parquet"
    pq.write_table(pa.Table.from_pylist([
        {"input_ids": ids, "loss_mask": [0] * 8 + [1] * (len(ids) - 8), "seq_len": len(ids), "dataset": "check",
         "source_row": i, "split": TRAIN if i < n_train else VALIDATION} for i, ids in enumerate(rows)]), merged)
    data_dir = out / "data"
    tr.write_dataset(merged, data_dir, list(range(len(rows))))
    write_locations(data_dir, store.locations(list(range(len(rows)))))
    vb.build(merged, min(2048, vocab), vocab, out / "d2t.npy", out / "t2d.npy", out / "vocab.json")
    return {"data_dir": data_dir, "ratio": train_ratio(n_train, len(rows)),
            "trained_tokens": sum(len(ids) for ids in rows[:n_train])}


TRAIN_CFG = {"num_layers": 1, "epochs": 2, "lr": 3e-4, "optimizer": "adamw", "weight_decay": 0.0, "scheduler": "none",
             "warmup_steps": None, "warmup_ratio": None, "total_seq_len": 2048, "ttt_steps": 3,
             "ttt_step_loss_decay": 1.0, "seed": 0, "max_steps": None, "architecture": "eagle3", "fc_norm": False,
             "draft_arch": "llama", "loss_fn": "kl_div", "train_lm_head": True}

SPECULATORS_LOOP = """import sys
from draftsmith.hidden_states import store  # noqa: F401 - the shard layout's reader, nothing else of draftsmith
from draftsmith.training.speculators_patches import adapt_for_cpu
from speculators.train import cli
from speculators.train.config import TrainConfig
if __name__ == "__main__":  # dataloader workers re-import this file
    adapt_for_cpu()  # a no-op with an accelerator; on a CPU speculators' loop cannot run without it
    cli.main(TrainConfig.resolve(sys.argv[1:]))
"""


def training(target: Path, data: dict, out: Path, processes: int, on_cpu: bool) -> dict:
    """draftsmith's trainer under torchrun, then speculators' own loop on the same arguments."""
    from draftsmith.core import compute
    from draftsmith.training import train as tr

    dtype = compute.choose("auto", training=True).dtype
    walls = {}
    for who in ("draftsmith", "speculators"):
        run_dir = out / f"train_{who}"
        argv = tr.speculators_args(TRAIN_CFG, verifier=str(target), data_dir=data["data_dir"],
                                   save_dir=run_dir / "checkpoints", d2t=out / "d2t.npy", t2d=out / "t2d.npy",
                                   aux_layers=AUX_LAYERS, train_ratio=data["ratio"], on_cpu=on_cpu,
                                   log_dir=run_dir / "logs", num_workers=1, hidden_states_backend="draftsmith",
                                   dtype=dtype)
        started = time.perf_counter()
        if who == "draftsmith":
            validation = tr.train_under_torchrun(processes, run_dir / "validation.jsonl", argv, os.cpu_count() or 1)
        else:
            loop = out / "speculators_loop.py"
            loop.write_text(SPECULATORS_LOOP)
            argv = [a for a in argv if a != tr.TRAIN_LM_HEAD]  # draftsmith's flag, not speculators'
            subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                            f"--nproc-per-node={processes}", str(loop), *argv], check=True,
                           env={**os.environ, "PYTHONPATH": str(REPO)})
        walls[who] = time.perf_counter() - started
    checkpoint, _ = tr.choose_checkpoint(out / "train_draftsmith" / "checkpoints", validation)
    tokens = TRAIN_CFG["epochs"] * data["trained_tokens"]
    return {"dtype": dtype, "validation": validation, "checkpoint": checkpoint,
            "tok_s": tokens / walls["draftsmith"], "speculators_tok_s": tokens / walls["speculators"]}


def export(checkpoint: Path, target: Path, out: Path) -> str:
    """The export vLLM reads, loaded back; and whether the draft LM head left the verifier's rows it
    started from (train_lm_head)."""
    import numpy as np
    import torch
    from safetensors.torch import load_file
    from speculators.models.eagle3 import Eagle3DraftModel

    from draftsmith.training.export import export_vllm

    drafter = out / "drafter"
    drafter.mkdir(exist_ok=True)
    export_vllm(checkpoint, drafter / "model.safetensors", drafter / "config.json", verifier_ref=str(target))
    model = Eagle3DraftModel.from_pretrained(str(drafter))
    d2t = torch.from_numpy(np.load(out / "d2t.npy"))
    start = load_file(str(target / "model.safetensors"))["lm_head.weight"][torch.arange(len(d2t)) + d2t]
    trained = load_file(str(drafter / "model.safetensors"))["lm_head.weight"]
    moved = (trained.float() - start.float()).abs().max().item()
    return (f"loads ({sum(p.numel() for p in model.parameters()):,} parameters, fc {tuple(model.fc.weight.shape)}); "
            f"draft LM head moved by up to {moved:.2e} from the verifier's rows it started from")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cpu", action="store_true", help="run every step on the CPU (what CI runs)")
    parser.add_argument("--out", type=Path, default=None, help="work folder (default: a new temporary one)")
    parser.add_argument("--processes", type=int, default=None, help="training ranks (default: 1 per GPU, 2 on a CPU)")
    args = parser.parse_args()
    import tempfile

    import torch

    out = args.out or Path(tempfile.mkdtemp(prefix="gpu_check."))
    out.mkdir(parents=True, exist_ok=True)
    has_cuda = torch.cuda.is_available()
    if not args.cpu and not has_cuda:
        say("no CUDA device here; run with --cpu for the same steps on the CPU")
        return 3
    device = "cpu" if args.cpu else "cuda"
    if args.cpu:
        os.environ["CUDA_VISIBLE_DEVICES"] = ""  # every process of the check, torchrun's ranks included
    from draftsmith.ops import devices

    say(f"python {sys.version.split()[0]}, torch {torch.__version__}, "
        f"device {torch.cuda.get_device_name(0) if device == 'cuda' else 'cpu'}, "
        f"NVIDIA driver {devices.driver_version() or 'none'}, work folder {out}")
    size = SIZES["cpu" if args.cpu else "gpu"]
    target = build_target(out / "target", size)
    rows = make_rows(size)
    say(f"tiny Qwen3 target: {size['layers']} layers, hidden {size['hidden']}, vocab {size['vocab']}; "
        f"{len(rows)} rows x {size['tokens']} tokens")

    ext = extraction(target, rows, out, device)
    say(f"hidden states ({ext['dtype']}, transformers backend on {device}): {ext['extract_tok_s']:,.0f} tok/s; "
        f"bare forward pass {ext['bare_tok_s']:,.0f} tok/s; ratio {ext['extract_tok_s'] / ext['bare_tok_s']:.2f}x")
    say(f"hidden states against the CPU's: {against_cpu(target, rows, ext['store'], device)}")

    not_run = []
    lacking = missing("speculators", "datasets", "pyarrow", "pydantic")
    if lacking:
        not_run.append(f"training and export: {', '.join(lacking)} not importable here (carry them as wheels; "
                       "compiled ones cannot be carried to the bare GPU machine)")
    else:
        data = training_data(rows, ext["store"], out, size["vocab"])
        processes = args.processes or (2 if args.cpu else torch.cuda.device_count())
        result = training(target, data, out, processes, on_cpu=args.cpu)
        backend = "gloo" if args.cpu else "NCCL"
        say(f"training ({result['dtype']}, {processes} {backend} rank(s) under torchrun, draft LM head trained): "
            f"{result['tok_s']:,.0f} tok/s; speculators' own loop {result['speculators_tok_s']:,.0f} tok/s; ratio "
            f"{result['tok_s'] / result['speculators_tok_s']:.2f}x (wall, process start included)")
        for epoch in result["validation"]:
            say(f"  epoch {epoch['epoch'] + 1}: full_acc_0 {epoch.get('full_acc_0_epoch', float('nan')):.3f}")
        say(f"export: {export(result['checkpoint'], target, out)}")
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        not_run.append(f"vLLM's steps (generation, vLLM hidden states, the export gate, evaluation): {err}. On a "
                       "CPU they run in the e2e tests; on GPUs they need a machine with vLLM's CUDA wheels")
    for item in not_run:
        say(f"not run here: {item}")
    (out / "gpu_check.json").write_text(json.dumps({"device": device, "not_run": not_run}, indent=1))
    say("done")
    return 0


if __name__ == "__main__":
    sys.exit(main())
