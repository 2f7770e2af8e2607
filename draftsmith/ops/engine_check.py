"""The engine check: can vLLM serve this target with a drafter of each family's shape? Asked before any work.

A target + drafter pair the engine cannot serve used to be found at the export gate only, after hours of
generation and training. Seen: a DeepSeek-V3-shaped (MLA) target with an EAGLE-3 drafter on vLLM-CPU,
``No common block size for 16 (CPU_MLA: [16]; CPU_ATTN: [MultipleOf(32)])`` on a CPU without AMX: the
target's MLA cache takes blocks of 16 there, the drafter's ordinary attention multiples of 32, and the
two share one KV-cache block size. Whether the engine serves a pair follows from the attention and
KV-cache geometry of both (and the drafter's layout), not from the target's depth, its expert count or
its weights. So the check starts vLLM on a *twin* of the target: its config with the same attention,
cache and rope shapes, four layers, a few small experts and no weights (``--load-format dummy``),
drafting with a freshly initialised drafter of each family, exported as the workflow exports a trained
one and loaded from its file as a trained one is. One short request; vLLM's own spec-decode counters say
whether it drafted. A 1T-parameter target (Kimi-K2, DeepSeek-V3) has a twin of about 1B parameters.

The widths must be the target's own, not merely its kind of attention: on vLLM-CPU 0.32 (no AMX) the
4-layer test DeepSeek-V3 (128 wide, 2 heads) is served with an EAGLE-3 drafter, the KV-cache manager
giving MLA and the drafter groups of their own; the twin of the real DeepSeek-V3 shape (7168 wide, 128
heads) fails with the block-size error above, in about 70 s on two cores.
"""

from __future__ import annotations

import asyncio
import json
import logging
import math
import re
import shutil
import time
from pathlib import Path

log = logging.getLogger(__name__)

# EAGLE-3 reads three auxiliary layers, which must be distinct layer ids below the depth: four layers is
# the least that holds them, and [1, 2, 3] are the ones the workflow itself uses on four-layer targets.
TWIN_LAYERS = 4
TWIN_AUX_LAYERS = (1, 2, 3)
# A few small experts keep every MoE code path (router, grouped top-k, shared expert, fused MoE kernel)
# without the weight: 4 experts, 2 per token (the top-k must not exceed the experts).
TWIN_EXPERTS = 4
TWIN_EXPERTS_PER_TOKEN = 2
# MLP widths per tensor-parallel shard: multiples of 128, the weight block of DeepSeek-V3's and Kimi's
# block-quantised fp8 checkpoints (vLLM refuses a shard that is not a whole number of blocks).
TWIN_INTERMEDIATE = 256
TWIN_MOE_INTERMEDIATE = 128
# The vocabulary is kept when its embedding (vocab x hidden) has at most this many parameters (256 MiB per
# matrix in bf16): the drafter maps onto it, and every tiny and small target keeps its own. Above it (a
# 7168-wide 163,840-token Kimi-K2: 1.2B parameters per matrix, four such matrices between the twin, the
# drafter and speculators' verifier stub) it is cut to fit: the vocabulary sizes no attention or cache
# shape, only the embedding, the LM head and the drafter's vocabulary map, which stay consistent with the
# cut size; the prompt the check sends uses low token ids only.
VOCAB_PARAMS_BUDGET = 2**27
VOCAB_MULTIPLE = 256
# Expert counts and experts per token under the names model families use (DeepSeek/Kimi, Qwen-MoE,
# Mixtral/gpt-oss/Llama-4, ERNIE; Hunyuan).
EXPERT_KEYS = ("n_routed_experts", "num_experts", "num_local_experts", "moe_num_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "experts_per_token", "moe_topk", "moe_k")
# Layer-count keys, and MLP widths shrunk to TWIN_INTERMEDIATE / TWIN_MOE_INTERMEDIATE per shard.
LAYER_KEYS = ("num_hidden_layers", "num_layers")
DENSE_WIDTH_KEYS = ("intermediate_size",)
MOE_WIDTH_KEYS = ("moe_intermediate_size", "shared_expert_intermediate_size")
# Weights (and their indexes) are never copied: vLLM starts the twin with --load-format dummy, and an index
# would send speculators looking for shards that are not there.
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".pth", ".gguf", ".ckpt", ".h5", ".msgpack", ".onnx", ".npz",
                   ".safetensors.index.json", ".bin.index.json")
# A random drafter's vocabulary: small (it sizes only the LM head and d2t/t2d, not the attention).
DRAFT_VOCAB = 512
EAGLE3_CHAIN = 3  # EAGLE-3's drafts per step, as at the export gate; a block family drafts its block
# The check's one request: a short prompt of low token ids (inside any twin's vocabulary), a few tokens out.
PROMPT_IDS = tuple(range(100, 132))
MAX_TOKENS = 16
MAX_MODEL_LEN = 512  # the twin's context: the request and a block of drafts fit, and the KV cache stays small


def text_config(config: dict) -> dict:
    """The language model's part of a config: multimodal targets (Kimi-K2.5, Qwen3-VL) nest it under
    ``text_config``; the attention and cache shapes the engine pairs with a drafter are there."""
    return config.get("text_config") or config


def _round_down(value: int, multiple: int) -> int:
    return max(multiple, value // multiple * multiple)


def twin_vocab(vocab: int, hidden: int) -> int:
    """The twin's vocabulary: the target's own unless its embedding exceeds :data:`VOCAB_PARAMS_BUDGET`
    parameters, then the largest multiple of :data:`VOCAB_MULTIPLE` within it (see there why)."""
    if vocab * hidden <= VOCAB_PARAMS_BUDGET:
        return vocab
    return min(vocab, _round_down(VOCAB_PARAMS_BUDGET // hidden, VOCAB_MULTIPLE))


def picked_layers(text: dict, count: int = TWIN_LAYERS) -> list[int]:
    """Which of the target's layers the twin keeps: the first ``count``, with the last ones swapped for the
    first layer of each attention kind (``layer_types``: sliding/full, linear/full) the first ``count``
    lack, so a hybrid target's twin has every kind of cache the engine must pair with the drafter's."""
    depth = next((text[k] for k in LAYER_KEYS if isinstance(text.get(k), int)), count)
    picks = list(range(min(count, depth)))
    kinds = text.get("layer_types")
    if not isinstance(kinds, list) or len(kinds) != depth:
        return picks
    for kind in dict.fromkeys(kinds):
        if kind in [kinds[i] for i in picks]:
            continue
        swappable = [p for p in reversed(picks) if [kinds[i] for i in picks].count(kinds[p]) > 1]
        if swappable:
            picks[picks.index(swappable[0])] = kinds.index(kind)
    return sorted(picks)


def _shrink_layers(text: dict, twin: dict) -> None:
    """Four layers, and every per-layer setting cut to the picked layers: lists as long as the depth
    (``layer_types``, ``no_rope_layers``) re-indexed, layer-id lists (``mlp_only_layers``) renumbered,
    ``first_k_dense_replace`` at most 1 so a dense and an MoE layer both stay."""
    depth = next((text[k] for k in LAYER_KEYS if isinstance(text.get(k), int)), None)
    if depth is None:
        return
    picks = picked_layers(text)
    for key in LAYER_KEYS:
        if text.get(key) == depth:
            twin[key] = len(picks)
    for key, value in text.items():
        if isinstance(value, list) and len(value) == depth and depth > 1 and key != "architectures":
            twin[key] = [value[i] for i in picks]
    if isinstance(text.get("mlp_only_layers"), list):
        twin["mlp_only_layers"] = [picks.index(i) for i in text["mlp_only_layers"] if i in picks]
    if isinstance(text.get("first_k_dense_replace"), int):
        twin["first_k_dense_replace"] = min(text["first_k_dense_replace"], 1)
    windowed = text.get("max_window_layers")
    if isinstance(windowed, int) and windowed < depth:  # Qwen2/3: layers from here on use the sliding window
        twin["max_window_layers"] = min(windowed, len(picks) // 2)


def _shrink_experts(text: dict, twin: dict, shards: int) -> None:
    """A few small experts: at most :data:`TWIN_EXPERTS` (a whole number per expert-parallel shard), at
    most :data:`TWIN_EXPERTS_PER_TOKEN` per token, one expert group (DeepSeek's grouped routing needs the
    experts to divide into ``n_group``), at most one shared expert."""
    experts = None
    for key in EXPERT_KEYS:
        if isinstance(text.get(key), int) and text[key] > 0:
            experts = twin[key] = min(text[key], math.ceil(TWIN_EXPERTS / shards) * shards)
    for key in EXPERTS_PER_TOKEN_KEYS:
        if isinstance(text.get(key), int) and text[key] > 0:
            twin[key] = min(text[key], TWIN_EXPERTS_PER_TOKEN, experts or text[key])
    for key in ("n_group", "topk_group"):
        if isinstance(text.get(key), int) and text[key] > 1:
            twin[key] = 1
    if isinstance(text.get("n_shared_experts"), int) and text["n_shared_experts"] > 1:
        twin["n_shared_experts"] = 1


def twin_config(config: dict, shards: int = 1) -> dict:
    """A config with the target's attention and KV-cache shapes, tiny everywhere else.

    Kept as they are: hidden size, heads, KV heads, head dims, MLA's latent ranks and rope/nope/value
    dims, rope settings, sliding window, max positions, dtype, model type, architectures, auto_map,
    quantization, and every key not named here (an unknown key may shape the attention). Shrunk: four
    layers (:func:`picked_layers`), a few small experts, MLP widths of :data:`TWIN_INTERMEDIATE` /
    :data:`TWIN_MOE_INTERMEDIATE` per shard (never wider than the target's), and the vocabulary only
    when huge (:func:`twin_vocab`). ``shards``: the tensor (times data, with expert parallelism)
    parallel size the server runs at, so each shard's slice of the twin is as whole as the target's.
    For a multimodal config only ``text_config`` changes; its vision tower stays as it is."""
    text = text_config(config)
    twin = dict(text)
    _shrink_layers(text, twin)
    _shrink_experts(text, twin, shards)
    for keys, width in ((DENSE_WIDTH_KEYS, TWIN_INTERMEDIATE), (MOE_WIDTH_KEYS, TWIN_MOE_INTERMEDIATE)):
        for key in keys:
            if isinstance(text.get(key), int):
                twin[key] = min(text[key], width * shards)
    if isinstance(text.get("vocab_size"), int) and isinstance(text.get("hidden_size"), int):
        twin["vocab_size"] = twin_vocab(text["vocab_size"], text["hidden_size"])
    if text is config:
        return twin
    out = {**config, "text_config": twin}
    if config.get("vocab_size") == text.get("vocab_size") and "vocab_size" in twin:
        out["vocab_size"] = twin["vocab_size"]
    return out


def is_weight(path: Path) -> bool:
    return path.name.endswith(WEIGHT_SUFFIXES)


def stub_dir(twin_dir: Path) -> Path:
    """Where :func:`verifier_stub` puts speculators' verifier: beside the twin, never in it."""
    return twin_dir.with_name(twin_dir.name + "-verifier")


def write_twin(target_dir: Path, dest: Path, shards: int = 1) -> Path:
    """The twin's folder: ``config.json`` from :func:`twin_config`, and the target's other top-level files
    but its weights (tokenizer, chat template, generation and processor configs, custom ``*.py`` code
    for ``trust_remote_code`` targets), so vLLM starts it as it starts the target, with ``--load-format
    dummy``. Files are copied, not linked: a Hugging Face cache's snapshot files are links into its blobs."""
    target_dir, dest = Path(target_dir), Path(dest)
    config = json.loads((target_dir / "config.json").read_text())
    for old in (dest, stub_dir(dest)):  # an earlier twin's stub may be another target's
        if old.exists():
            shutil.rmtree(old)
    dest.mkdir(parents=True)
    for path in sorted(target_dir.iterdir()):
        if path.is_file() and path.name != "config.json" and not is_weight(path) and not path.name.startswith("."):
            shutil.copyfile(path, dest / path.name)
    (dest / "config.json").write_text(json.dumps(twin_config(config, shards), indent=2) + "\n")
    return dest


def verifier_stub(twin_dir: Path) -> Path:
    """What speculators reads as the verifier to build a drafter: the twin's files and random embedding,
    LM head and final norm weights (speculators copies them into a new drafter; nothing else of the
    target is read). Beside the twin, never in it: the twin itself has no weights."""
    import torch
    from safetensors.torch import save_file

    stub = stub_dir(twin_dir)
    if (stub / "model.safetensors").is_file():  # built for this twin by an earlier family
        return stub
    if stub.exists():
        shutil.rmtree(stub)
    stub.mkdir(parents=True)
    for path in twin_dir.iterdir():
        if path.is_file():
            (stub / path.name).symlink_to(path.resolve())
    text = text_config(json.loads((twin_dir / "config.json").read_text()))
    vocab, hidden = text["vocab_size"], text["hidden_size"]
    generator = torch.Generator().manual_seed(0)
    save_file({"model.embed_tokens.weight": (torch.randn(vocab, hidden, generator=generator) * 0.02).bfloat16(),
               "lm_head.weight": (torch.randn(vocab, hidden, generator=generator) * 0.02).bfloat16(),
               "model.norm.weight": torch.ones(hidden, dtype=torch.bfloat16)}, stub / "model.safetensors")
    return stub


def random_drafter(twin_dir: Path, family: str, dest: Path, block_size: int | None = None,
                   num_layers: int | None = None, flags: tuple[str, ...] = (),
                   trust_remote_code: bool = False) -> Path:
    """A freshly initialised speculators drafter of ``family`` for the twin, exported to ``dest`` as the
    workflow exports a trained one (:func:`draftsmith.training.export.export_vllm`: ``final.safetensors``
    and ``config.json``), so vLLM reads the same layout and config keys it will read after training.

    Built the way training builds one (speculators' own CLI, ``--dry-run``): a random vocabulary map of
    :data:`DRAFT_VOCAB` tokens over the twin's vocabulary, layers :data:`TWIN_AUX_LAYERS`, SDPA attention,
    and for a block family the twin's last embedding row as its mask token. ``block_size`` and
    ``num_layers``: the configured ones (None: speculators' defaults, as training takes them); ``flags``:
    further speculators model flags (EAGLE-3's architecture, ``--draft-arch``)."""
    import numpy as np
    from speculators.train import cli
    from speculators.train.config import TrainConfig

    from draftsmith.training import export as ex
    from draftsmith.training import families

    if family not in families.VLLM_METHOD:
        raise ValueError(f"unknown drafter family {family!r}; one of {', '.join(families.VLLM_METHOD)}")
    twin_dir, dest = Path(twin_dir), Path(dest)
    stub = verifier_stub(twin_dir)
    vocab = text_config(json.loads((twin_dir / "config.json").read_text()))["vocab_size"]
    raw = dest.with_name(dest.name + "-speculators")
    if raw.exists():
        shutil.rmtree(raw)
    raw.mkdir(parents=True)
    draft_vocab = min(DRAFT_VOCAB, vocab)
    chosen = np.sort(np.random.default_rng(0).choice(vocab, draft_vocab, replace=False))
    np.save(raw / "d2t.npy", (chosen - np.arange(draft_vocab)).astype(np.int64))
    t2d = np.zeros(vocab, dtype=bool)
    t2d[chosen] = True
    np.save(raw / "t2d.npy", t2d)
    argv = ["--verifier-name-or-path", str(stub), "--save-path", str(raw / "checkpoint"), "--dry-run",
            "--draft-attn-impl", "sdpa", "--d2t-path", str(raw / "d2t.npy"), "--t2d-path", str(raw / "t2d.npy"),
            "--target-layer-ids", *map(str, TWIN_AUX_LAYERS), "--log-dir", str(raw / "logs")]
    if family != families.DEFAULT_FAMILY:
        argv += ["--speculator-type", family, "--mask-token-id", str(vocab - 1)]
        argv += ["--block-size", str(block_size)] if block_size is not None else []
    argv += ["--num-layers", str(num_layers)] if num_layers is not None else []
    argv += [*flags, *(["--trust-remote-code"] if trust_remote_code else [])]
    cli.main(TrainConfig.resolve(argv))
    dest.mkdir(parents=True, exist_ok=True)
    ex.export_vllm(raw / "checkpoint", dest / "final.safetensors", dest / "config.json", verifier_ref=str(twin_dir))
    return dest


def drafter_shapes(train: dict) -> dict[str, dict]:
    """What each family's drafter is built with in training (the config's ``train`` section), for
    :func:`check`'s ``shapes``: EAGLE-3's layers, decoder layer and architecture flags, a block family's
    layers and block. Plain values (no import), so a rule's params can hold them and rerun the check when
    they change."""
    shapes: dict[str, dict] = {"eagle3": {k: train[k] for k in ("num_layers", "draft_arch", "architecture",
                                                                  "fc_norm", "train_lm_head") if k in train}}
    for family in ("dflash", "dspark"):
        block = train.get(family) or {}
        shapes[family] = {k: block[k] for k in ("num_layers", "block_size") if block.get(k) is not None}
    return shapes


def drafter_kwargs(family: str, shape: dict) -> dict:
    """:func:`random_drafter`'s keywords for a family's shape (:func:`drafter_shapes`): EAGLE-3's flags as
    training passes them (:func:`draftsmith.training.train.eagle3_model_flags`), a block family's sizes."""
    from draftsmith.training import families

    if family != families.DEFAULT_FAMILY:
        return {"block_size": shape.get("block_size"), "num_layers": shape.get("num_layers")}
    from draftsmith.training import train

    flags = train.eagle3_model_flags({"architecture": shape.get("architecture", "speculators"),
                                      "fc_norm": shape.get("fc_norm", False),
                                      "train_lm_head": shape.get("train_lm_head", False)})
    if shape.get("draft_arch"):
        flags += ["--draft-arch", shape["draft_arch"]]
    return {"num_layers": shape.get("num_layers"), "flags": tuple(flags)}


def parallel_shards(extra_args: list[str]) -> int:
    """How many shards the server splits each layer's weights and experts into: the tensor-parallel size,
    times the data-parallel size where experts are spread over both (``--enable-expert-parallel``)."""
    def value(*names: str) -> int:
        for i, arg in enumerate(extra_args):
            for name in names:
                if arg == name and i + 1 < len(extra_args):
                    return int(extra_args[i + 1])
                if arg.startswith(name + "="):
                    return int(arg.split("=", 1)[1])
        return 1

    tp = value("--tensor-parallel-size", "-tp")
    dp = value("--data-parallel-size", "-dp")
    expert_parallel = any(a in ("--enable-expert-parallel", "-ep") for a in extra_args)
    return tp * (dp if expert_parallel else 1)


# vLLM's log lines: "(EngineCore pid=12) ERROR 12-05 08:40:00 [core.py:1] ValueError: ..." or a traceback's
# "ValueError: ..." after the process tag. The first exception line not of a wrapper is the root cause
# (Python prints a chained traceback's cause first; the API server's own failure follows it).
LOG_PREFIX = re.compile(r"^(?:\([^)]*\)\s*)?(?:(?:DEBUG|INFO|WARNING|ERROR|CRITICAL)\s+\S+\s+\S+\s+\[[^\]]*\]\s*)?")
EXCEPTION_LINE = re.compile(r"^(?:[A-Za-z_][\w.]*\.)?[A-Z]\w*(?:Error|Exception)(?:: .*)?$")
WRAPPER_ERRORS = ("Engine core initialization failed", "See root cause above", "Engine process failed to start",
                  "Worker failed with error", "EngineCore encountered an issue", "EngineDeadError")


def key_error_line(log_text: str) -> str | None:
    """The line of a server log that says why it failed (e.g. ``ValueError: No common block size for 16
    (...)``), without vLLM's process tag and log prefix, or None when it holds no exception."""
    lines = [LOG_PREFIX.sub("", line).strip() for line in log_text.splitlines()]
    found = [line for line in lines if EXCEPTION_LINE.match(line)]
    causes = [line for line in found if not any(w in line for w in WRAPPER_ERRORS)]
    return (causes or found or [None])[0]


def _served(twin: Path, drafter: Path, server_cfg: dict, log_path: Path, trust_remote_code: bool) -> dict:
    """Start vLLM on the twin with the drafter, send one request, read the spec-decode counters."""
    import httpx

    from draftsmith.config.target import Target
    from draftsmith.evaluation.measure import evaluate as ev
    from draftsmith.generation.client import RequestFailed
    from draftsmith.generation.server import ServerError, managed_server
    from draftsmith.training.replay import GREEDY

    method, k = ev.drafted_per_step(str(drafter), EAGLE3_CHAIN)
    target = Target(name=twin.name, source=str(twin), kind="folder", trust_remote_code=trust_remote_code)
    spec = ev.server_spec("vllm", target, server_cfg, method, k, str(drafter))
    # The drafter's own file, not random values: vLLM's default would load it as the target (dummy),
    # leaving its weight names unchecked and its vocabulary map (integers, never filled) all zeros.
    spec.speculative_config["draft_load_config"] = {"load_format": "auto"}
    positions = text_config(json.loads((twin / "config.json").read_text())).get("max_position_embeddings")
    spec.max_model_len = min(server_cfg.get("max_model_len") or MAX_MODEL_LEN, positions or MAX_MODEL_LEN,
                             MAX_MODEL_LEN)
    spec.extra_args = [*spec.extra_args, "--load-format", "dummy"]  # last: it wins over the user's flags
    log_path.unlink(missing_ok=True)
    prompt = list(PROMPT_IDS)
    try:
        with managed_server(spec, log_path) as server:
            root = ev.root_of(server.base_url)
            before = ev.scrape_spec_counters(root)
            asyncio.run(ev.continue_tokens(server.base_url, spec.model, [(prompt, MAX_TOKENS, GREEDY)], 1,
                                           ignore_eos=True))
            drafts = ev.acceptance(before, ev.scrape_spec_counters(root))["drafts"]
    except (ServerError, RequestFailed, httpx.HTTPError) as err:
        key = key_error_line(log_path.read_text(errors="replace")) if log_path.is_file() else None
        return {"served": False, "drafts": None, "error": key or str(err).splitlines()[0]}
    if not drafts:
        return {"served": False, "drafts": 0, "error": f"vLLM served the request but proposed no drafts ({method})"}
    return {"served": True, "drafts": int(drafts), "error": None}


def check(target_dir: Path, families: list[str], server_cfg: dict, work: Path, log_dir: Path,
          trust_remote_code: bool = False, shapes: dict[str, dict] | None = None) -> dict:
    """For each family, whether vLLM serves the target with a drafter of that family: ``{family: {"served",
    "seconds", "drafts", "error", "log"}}`` (``error``: the key line of the server's log). A family the
    engine here does not serve at all (:func:`draftsmith.training.families.not_served_here`) is not
    started: ``served`` None and ``skipped`` says why. ``server_cfg``: the config's ``server`` section, as
    the workflow's servers are started (its ``gpus`` says which engine build); ``shapes``: per family,
    the drafter's shape as the run trains it (:func:`drafter_shapes`; none: speculators' defaults). The twin,
    the drafters and speculators' stub stay under ``work``; each family's server log is in ``log_dir``."""
    from draftsmith.generation.server import engine_args
    from draftsmith.training import families as fam

    work, log_dir = Path(work), Path(log_dir)
    on_gpus = server_cfg.get("gpus", 0) > 0
    twin = write_twin(Path(target_dir), work / "twin", parallel_shards(engine_args(server_cfg, "vllm")))
    results: dict[str, dict] = {}
    for family in families:
        started = time.monotonic()
        log_path = log_dir / f"{family}.server.log"
        skipped = fam.not_served_here(family, on_gpus=on_gpus)
        if skipped:
            results[family] = {"served": None, "seconds": 0.0, "drafts": None, "error": None, "skipped": skipped}
            log.info("%s: not started: %s", family, skipped)
            continue
        try:
            drafter = random_drafter(twin, family, work / "drafters" / family, trust_remote_code=trust_remote_code,
                                     **drafter_kwargs(family, (shapes or {}).get(family, {})))
        except (ValueError, RuntimeError, KeyError, AttributeError, OSError) as err:
            # training would build it the same way and fail the same, hours later
            log.exception("%s: speculators could not build the drafter", family)
            first = (str(err).splitlines() or [type(err).__name__])[0]
            result = {"served": False, "drafts": None,
                      "error": f"speculators could not build the {family} drafter for this target: {first}"}
        else:
            result = _served(twin, drafter, server_cfg, log_path, trust_remote_code)
        results[family] = {**result, "seconds": round(time.monotonic() - started, 1),
                           "log": str(log_path) if log_path.is_file() else None}
        log.info("%s: %s", family, results[family])
    return results


def key(family: str, shape: dict, server_cfg: dict) -> str:
    """What a family's verdict depends on: its drafter's shape and how vLLM is started (the engine build, the
    user's flags and environment, the dtype)."""
    from draftsmith.core.digest import json_digest
    from draftsmith.generation.server import engine_args

    return json_digest({"family": family, "shape": shape, "gpus": server_cfg.get("gpus", 0) > 0,
                        "vllm": engine_version(), "args": engine_args(server_cfg, "vllm"),
                        "env": server_cfg.get("env", {}), "dtype": server_cfg.get("dtype")}, 16)


def engine_version() -> str | None:
    """The installed vLLM's version (its CUDA or its CPU build), None where none is."""
    from importlib.metadata import PackageNotFoundError, version

    for name in ("vllm", "vllm-cpu"):
        try:
            return version(name)
        except PackageNotFoundError:
            continue
    return None


def verdicts(target_dir: Path, families: list[str], server_cfg: dict, work: Path, log_dir: Path,
             trust_remote_code: bool, shapes: dict[str, dict], earlier: dict | None = None) -> dict:
    """:func:`check` for each family whose ``earlier`` verdict (the preflight's, made before any work) was not
    made with the same :func:`key`: the check before work and the pick's read one verdict, never two
    servers for one question. Each verdict carries its key."""
    keys = {family: key(family, shapes.get(family, {}), server_cfg) for family in families}
    kept = {f: earlier[f] for f in families if (earlier or {}).get(f, {}).get("key") == keys[f]
            and earlier[f].get("served") is not False}
    todo = [f for f in families if f not in kept]
    checked = check(target_dir, todo, server_cfg, work, log_dir, trust_remote_code, shapes) if todo else {}
    for family in kept:
        log.info("%s: served before any work, with the same shape and server settings", family)
    return {f: {**(kept.get(f) or checked[f]), "key": keys[f]} for f in families}


# Where the checks keep the twin, the drafters and the verdicts made before any work (relative to the
# workflow's working directory, as every rule's files are); the preflight's server logs.
WORK = Path("results/checks/engine")
BEFORE_WORK = WORK / "before_work.json"
BEFORE_WORK_LOGS = Path("logs/preflight")


def before_work(config: dict, target) -> dict:
    """The check of the families configured now, made by the preflight job (which every generation,
    extraction and warm-start job waits for): its verdicts go to :data:`BEFORE_WORK`, where the engine
    check the pick reads finds them (:func:`verdicts`' ``earlier``). The preflight's own script is left as it
    was: an edit to it would rerun the preflight in every finished project, and Snakemake, through its
    ancient() edges, would then run nothing else in that invocation."""
    from draftsmith.core.atomic import write_json

    results = run(target, list(config["train"]["families"]), config["server"], drafter_shapes(config["train"]),
                  WORK, BEFORE_WORK_LOGS)
    write_json(BEFORE_WORK, results)
    return results


def earlier_verdicts() -> dict | None:
    """The verdicts the preflight made before any work, where it made them (projects prepared before it did
    have none)."""
    return json.loads(BEFORE_WORK.read_text()) if BEFORE_WORK.is_file() else None


def run(target, families: list[str], server_cfg: dict, shapes: dict[str, dict], work: Path, log_dir: Path,
        earlier: dict | None = None) -> dict:
    """The verdicts of a job (:func:`verdicts` for ``target``, a :class:`~draftsmith.config.target.Target`),
    raising the :func:`failure_message` when a family is not served."""
    from draftsmith.config import target as targets

    config = targets.config_path(target)
    if config is None:
        targets.load_config(target)  # raises FileNotFoundError saying where the config was looked for
    results = verdicts(config.parent, families, server_cfg, work, log_dir, target.trust_remote_code, shapes, earlier)
    log.info("engine check: %s", json.dumps(results))
    failure = failure_message(results, target.name, on_gpus=server_cfg["gpus"] > 0)
    if failure:
        raise ValueError(failure)
    return results


def failure_message(results: dict, target: str, on_gpus: bool) -> str | None:
    """One line naming each family the engine cannot serve with ``target``, its key error line, and what to
    do; None when every family started was served."""
    failed = {f: r for f, r in results.items() if r.get("served") is False}
    if not failed:
        return None
    names = ", ".join(failed)
    why = "; ".join(f"{f}: {r['error']}" for f, r in failed.items())
    fixes = ([] if on_gpus else ["serve on GPUs (server.gpus)"]) + [
        f"leave {names} out of train.families",
        "or set server.engine_check: false to go on unchecked (the export gate then fails it after training)"]
    logs = ", ".join(r["log"] for r in failed.values() if r.get("log"))
    return (f"engine check: vLLM cannot serve target {target} with a drafter of family {names} ({why}); to go on: "
            + ", ".join(fixes) + (f" (server logs: {logs})" if logs else ""))
