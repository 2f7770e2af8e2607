"""Warm start: bring a published EAGLE-3 drafter in, check it fits the target, keep its mapping.

A pretrained drafter is a folder or a hub id (read from the local Hugging Face cache when it holds
a snapshot) in one of two layouts:

- speculators' (``config.json`` with ``speculators_config``; what ``speculators train`` writes);
- the original EAGLE-3 / SpecForge one (a ``LlamaConfig``-like config, ``midlayer.*`` weights,
  ``d2t``/``t2d``), converted with speculators' own ``Eagle3Converter``.

It is written to ``results/pretrained/`` in speculators' layout with the verifier pointing at this
workflow's target, its ``d2t``/``t2d`` saved beside it (the vocab rule copies them: a rebuilt
mapping would silently misalign the pretrained LM head), and every fact that must agree with the
target checked first. A mismatch is refused with the tensor or key and both values.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

from draftsmith.config.target import Facts
from draftsmith.core.atomic import atomic_path, write_json


class DrafterMismatch(ValueError):
    pass


def locate(source: str, base_dir: Path) -> Path:
    local = Path(source) if Path(source).is_absolute() else base_dir / source
    if local.is_dir():
        return local
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import LocalEntryNotFoundError

    try:
        return Path(snapshot_download(source, local_files_only=True))
    except (LocalEntryNotFoundError, ValueError):
        try:
            return Path(snapshot_download(source))
        except Exception as err:  # offline, unknown id
            raise FileNotFoundError(f"train.from_pretrained {source}: not a folder, not in the local Hugging Face "
                                    f"cache, and not downloadable here ({type(err).__name__})") from None


def layout_of(folder: Path) -> str:
    config = json.loads((folder / "config.json").read_text())
    if config.get("speculators_model_type") == "eagle3":
        return "speculators"
    if config.get("speculators_model_type"):
        raise DrafterMismatch(f"{folder}: a {config['speculators_model_type']} speculator, not EAGLE-3")
    return "eagle3"


def _weights_file(folder: Path) -> Path:
    files = sorted(folder.glob("*.safetensors"))
    if len(files) != 1:
        raise DrafterMismatch(f"{folder}: expected one .safetensors weights file, found {len(files)}")
    return files[0]


def normalize(folder: Path, dest: Path, verifier: str, aux_layers: list[int] | None) -> None:
    """Write ``dest`` in speculators' layout, verifier = this workflow's target."""
    with atomic_path(dest) as tmp:
        if layout_of(folder) == "speculators":
            tmp.mkdir()
            shutil.copyfile(_weights_file(folder), tmp / "model.safetensors")
            config = json.loads((folder / "config.json").read_text())
        else:
            from speculators.convert.eagle.eagle3_converter import Eagle3Converter

            source = json.loads((folder / "config.json").read_text())
            layers = aux_layers or (source.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
            Eagle3Converter().convert(folder, tmp, base_model=verifier, validate=False,
                                      eagle_aux_hidden_state_layer_ids=layers)
            config = json.loads((tmp / "config.json").read_text())
        config["speculators_config"]["verifier"]["name_or_path"] = verifier
        (tmp / "config.json").write_text(json.dumps(config, indent=2, sort_keys=True) + "\n")


def fit_problems(config: dict, shapes: dict[str, list[int]], facts: Facts, aux_layers: list[int] | None
                 ) -> list[str]:
    """Every way the drafter does not fit the target, each naming the key or tensor and both values."""
    found = []
    layer = config["transformer_layer_config"]
    hidden, target_hidden = layer["hidden_size"], config.get("target_hidden_size") or layer["hidden_size"]
    if target_hidden != facts.hidden_size:
        found.append(f"hidden size: the drafter reads target hidden states of size {target_hidden}, the target's "
                     f"hidden_size is {facts.hidden_size}")
    fc = shapes.get("fc.weight")
    if fc != [hidden, 3 * facts.hidden_size]:
        found.append(f"tensor fc.weight is {fc}, the target needs [{hidden}, {3 * facts.hidden_size}] "
                     f"(hidden {hidden}, three target layers of {facts.hidden_size})")
    for name, expected, what in (("t2d", facts.vocab_size, "the target's vocabulary"),
                                 ("embed_tokens.weight", facts.vocab_size, "the target's vocabulary")):
        if name in shapes and shapes[name][0] != expected:
            found.append(f"tensor {name} has {shapes[name][0]} rows, {what} has {expected}")
    if "t2d" not in shapes or "d2t" not in shapes:
        found.append("tensors d2t/t2d are missing: without its mapping the drafter's LM head cannot be aligned")
    draft_vocab = config.get("draft_vocab_size")
    for name in ("d2t", "lm_head.weight"):
        if name in shapes and shapes[name][0] != draft_vocab:
            found.append(f"tensor {name} has {shapes[name][0]} rows, config draft_vocab_size is {draft_vocab}")
    if layer.get("vocab_size") not in (None, facts.vocab_size):
        found.append(f"config transformer_layer_config.vocab_size is {layer['vocab_size']}, the target's "
                     f"vocabulary has {facts.vocab_size}")
    layers = config.get("eagle_aux_hidden_state_layer_ids")
    if layers and max(layers) > facts.num_layers:
        found.append(f"config eagle_aux_hidden_state_layer_ids {layers}: the target has {facts.num_layers} layers")
    if aux_layers is not None and layers and list(layers) != list(aux_layers):
        found.append(f"hidden_states.aux_layers is {aux_layers} but the drafter was trained on layers {layers} "
                     "(leave aux_layers unset to use the drafter's)")
    return found


def import_pretrained(source: str, base_dir: Path, verifier: str, facts: Facts, aux_layers: list[int] | None,
                      dest: Path, require_sglang: bool) -> dict:
    """Normalise, check and unpack a pretrained drafter into ``dest``; return what was checked."""
    import numpy as np
    from safetensors.torch import load_file

    from draftsmith.core.digest import file_sha256
    from draftsmith.training.export import sglang_refusal, tensor_shapes

    folder = locate(source, base_dir)
    layout = layout_of(folder)
    normalize(folder, dest, verifier, aux_layers)
    config = json.loads((dest / "config.json").read_text())
    shapes = tensor_shapes(dest / "model.safetensors")
    problems = fit_problems(config, shapes, facts, aux_layers)
    if require_sglang and sglang_refusal(config):
        problems.append(f"export.sglang is on but {sglang_refusal(config)}")
    if problems:
        shutil.rmtree(dest)
        raise DrafterMismatch(f"train.from_pretrained {source} does not fit the target:\n"
                              + "\n".join(f"  - {p}" for p in problems))
    tensors = load_file(dest / "model.safetensors")
    np.save(dest / "d2t.npy", tensors["d2t"].numpy())
    np.save(dest / "t2d.npy", tensors["t2d"].numpy())
    check = {"source": source, "layout": layout, "aux_layers": config["eagle_aux_hidden_state_layer_ids"],
             "draft_vocab_size": config["draft_vocab_size"], "hidden_size": config["transformer_layer_config"][
                 "hidden_size"], "num_layers": config["transformer_layer_config"]["num_hidden_layers"],
             "d2t_sha256": file_sha256(dest / "d2t.npy"), "t2d_sha256": file_sha256(dest / "t2d.npy")}
    write_json(dest / "check.json", check)
    return check
