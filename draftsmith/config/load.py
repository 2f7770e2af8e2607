"""The workflow configuration: layered loading, validation against ``schema.yaml`` with defaults,
and the split between what a setting computes and how a job runs.

Layers: the schema's defaults, then each ``--configfile`` in order, then ``--config key=value``
overrides. The embedded default (``config/config.yaml``: the CPU demo) is one such file, used
when the user names none; a user's file never sits on it. A later file's ``datasets`` and
``evaluation.prompt_sets`` *replace* the ones below them (a file that brings one dataset gets one
dataset); every other section merges key by key. Settings only a CPU needs (eager mode, the CPU
KV cache) are in no file: :mod:`draftsmith.generation.server` adds them on a machine without an accelerator.

``python -m draftsmith.config.load [--configfile F ...] [--config K=V ...]`` (``./run.sh config``)
prints the effective config as YAML with each value's origin in a comment.
"""

from __future__ import annotations

import copy
import logging
import re
import sys
from importlib.resources import files
from pathlib import Path
from typing import Any

import jsonschema
import yaml

from draftsmith.config import snakemake_args

SCHEMA = yaml.safe_load(files("draftsmith.config").joinpath("schema.yaml").read_text())
WORKFLOW_DIR = Path(__file__).resolve().parents[2]  # the checkout: Snakefile, config/, rules/
REPLACED = (("datasets",), ("evaluation", "prompt_sets"))
log = logging.getLogger(__name__)
EMBEDDED = Path("config") / "config.yaml"  # in the workflow folder
DEFAULT_ORIGIN = "default"


class ConfigError(ValueError):
    pass


def config_files(workflow_dir: Path, user_files: list[Path]) -> list[Path]:
    """The files laid over the schema's defaults: the user's, or the embedded default when none."""
    return [Path(p) for p in user_files] or [Path(workflow_dir) / EMBEDDED]


def load_layers(config_files: list[Path], overrides: dict[str, Any]) -> dict[str, Any]:
    """The merged, unvalidated config (see the module docstring for the rules)."""
    config: dict[str, Any] = {}
    for path in config_files:
        config = merge(config, _read(path))
    return merge(config, _typed(overrides))


def origins(config_files: list[Path], overrides: dict[str, Any]) -> dict[tuple[str, ...], str]:
    """Which layer set each value: the last file (or ``--config``) that wrote it; a replaced
    section forgets what the layers below wrote in it. Values no layer wrote are defaults."""
    found: dict[tuple[str, ...], str] = {}
    layers = [(_read(p), str(p)) for p in config_files] + [(_typed(overrides), "--config")]
    for data, origin in layers:
        _mark(data, (), origin, found)
    return found


def _mark(data: Any, where: tuple[str, ...], origin: str, found: dict) -> None:
    if where in REPLACED:
        for key in [k for k in found if k[: len(where)] == where]:
            del found[key]
    if isinstance(data, dict) and data:
        for key, value in data.items():
            _mark(value, (*where, key), origin, found)
    else:
        found[where] = origin


def _typed(value: Any) -> Any:
    """``--config`` values: Snakemake reads nested ones as strings (its YAML BaseLoader)."""
    if isinstance(value, dict):
        return {k: _typed(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_typed(v) for v in value]
    if isinstance(value, str):
        try:
            return yaml.safe_load(value)
        except yaml.YAMLError:
            return value
    return value


def merge(base: dict[str, Any], upper: dict[str, Any], where: tuple[str, ...] = ()) -> dict[str, Any]:
    out = copy.deepcopy(base)
    for key, value in upper.items():
        path = (*where, key)
        if isinstance(value, dict) and isinstance(out.get(key), dict) and path not in REPLACED:
            out[key] = merge(out[key], value, path)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _read(path: Path) -> dict[str, Any]:
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8-sig"))
    except OSError as err:
        raise ConfigError(f"cannot read config file {path}: {err.strerror}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{path}: not valid YAML: {err}") from None
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: a config file must hold a mapping of sections, got {type(data).__name__}")
    return data


def _with_defaults(validator_class):
    validate_properties = validator_class.VALIDATORS["properties"]

    def set_defaults(validator, properties, instance, schema):
        if isinstance(instance, dict):
            for name, sub in properties.items():
                if isinstance(sub, dict) and "default" in sub:
                    instance.setdefault(name, copy.deepcopy(sub["default"]))
        yield from validate_properties(validator, properties, instance, schema)

    return jsonschema.validators.extend(validator_class, {"properties": set_defaults})


_Validator = _with_defaults(jsonschema.Draft202012Validator)


def validate_config(config: dict[str, Any]) -> dict[str, Any]:
    """Return a validated copy with defaults filled and keys sorted; raise :class:`ConfigError`
    naming every bad key.

    Keys are sorted at every level because Snakemake compares rule params by their text: the
    same settings written in another order must not rerun a dataset.
    """
    config = copy.deepcopy(config)
    errors = sorted(_Validator(SCHEMA).iter_errors(config), key=lambda e: list(e.absolute_path))
    if errors:
        raise ConfigError("invalid config:\n" + "\n".join(f"  - {_where(e)}: {_message(e)}" for e in errors))
    for said in deprecated(config):
        log.warning("%s", said)
    return _sorted(config)


def deprecated(config: dict[str, Any]) -> list[str]:
    """What the schema says (``x-deprecated``) of each deprecated key the config sets to other than its default:
    it still works, and a project that does not set it is told nothing."""
    out = []
    for key, sub in _leaves(SCHEMA, ()):
        value: Any = config
        for part in key.split("."):
            value = value.get(part, sub.get("default")) if isinstance(value, dict) else None
        if sub.get("x-deprecated") and value != sub.get("default"):
            out.append(sub["x-deprecated"])
    return out


# Where a config holds values, not names, of what the environment keeps secret: the servers' environments
# (``server.env``, ``generation_server.env``: an HF_TOKEN, say) and the endpoint's literal headers (an
# Authorization value; a header ``{env: NAME}`` names its variable and stays). API keys are named, never held
# (``generation_server.api_key_env``).
SECRET_NAME = re.compile(r"TOKEN|KEY|SECRET|PASSWORD|CREDENTIAL|AUTH", re.IGNORECASE)
REDACTED = "<redacted>"
# An engine flag whose value is a secret: vLLM's --hf-token (a gated target) and --api-key (the server's), and any
# flag whose last word is token, key, secret, password or credential(s); never --max-num-batched-tokens's count.
SECRET_FLAG = re.compile(r"^--?(?:[A-Za-z0-9]+[-_])*(?:token|key|secret|password|passwd|credentials?)$", re.IGNORECASE)
# The user and password of a URL (an endpoint's, a proxy's in the environment): https://user:password@host
URL_CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


def redacted_args(args: list[str] | None) -> list[str] | None:
    """Engine flags with the value of each :data:`SECRET_FLAG` (``--hf-token X`` or ``--api-key=X``) as
    :data:`REDACTED`, and URLs without their credentials; the rest as they are."""
    if args is None:
        return None
    out: list[str] = []
    hide = False
    for arg in args:
        name, eq, _ = arg.partition("=")
        if hide:
            out.append(REDACTED)
        elif name.startswith("-") and SECRET_FLAG.match(name):
            out.append(f"{name}={REDACTED}" if eq else arg)
        else:
            out.append(_without_credentials(arg))
        hide = not hide and not eq and name.startswith("-") and bool(SECRET_FLAG.match(name))
    return out


def _without_credentials(value: Any) -> Any:
    return URL_CREDENTIALS.sub(f"{REDACTED}@", value) if isinstance(value, str) else value


def shareable(config: dict[str, Any]) -> dict[str, Any]:
    """``config`` to publish beside a drafter: every value as it is, but the secret ones (:data:`SECRET_NAME`'s
    environment variables, literal headers, the values of secret engine flags, a URL's credentials) as
    :data:`REDACTED`."""
    out = copy.deepcopy(config)
    for section in ("server", "generation_server"):
        part = out.get(section) or {}
        env = part.get("env") or {}
        env.update({name: REDACTED if SECRET_NAME.search(name) else _without_credentials(value)
                    for name, value in env.items()})
        for key in ("extra_args", "sglang_args"):
            if isinstance(part.get(key), list):
                part[key] = redacted_args(part[key])
        if isinstance(part.get("base_urls"), list):
            part["base_urls"] = [_without_credentials(url) for url in part["base_urls"]]
    headers = out.get("generation_server", {}).get("headers") or {}
    headers.update({name: REDACTED for name, value in headers.items() if not isinstance(value, dict)})
    return out


def shareable_yaml(config: dict[str, Any]) -> str:
    """:func:`shareable` as the YAML file a drafter's folder holds: ``./run.sh --configfile`` reads it back."""
    return ("# draftsmith: the effective config this drafter was made with (./run.sh config), secret values "
            f"{REDACTED}\n" + yaml.safe_dump(shareable(config), sort_keys=False))


def result_view(config: dict[str, Any]) -> dict[str, Any]:
    """The config without its operational keys (``x-operational`` in the schema): what rule
    params, run keys and journal names are made of."""
    return _strip(config, SCHEMA)


def _strip(value: Any, schema: dict) -> Any:
    schema = _resolve(schema)
    if not isinstance(value, dict):
        return value
    properties = schema.get("properties", {})
    extra = schema.get("additionalProperties")
    out = {}
    for key, item in value.items():
        sub = properties.get(key, extra if isinstance(extra, dict) else {})
        sub = _resolve(sub) if isinstance(sub, dict) else {}
        if not sub.get("x-operational"):
            out[key] = _strip(item, sub)
    return out


def _resolve(schema: dict) -> dict:
    """Flatten ``$ref`` and ``allOf`` into one schema with the union of their properties."""
    if "$ref" in schema:
        schema = {**SCHEMA["$defs"][schema["$ref"].rsplit("/", 1)[-1]], **{k: v for k, v in schema.items()
                                                                           if k != "$ref"}}
    if "allOf" in schema:
        merged: dict = {"properties": {}}
        for part in schema["allOf"]:
            part = _resolve(part)
            for name, sub in part.get("properties", {}).items():
                if sub is not True or name not in merged["properties"]:
                    merged["properties"][name] = sub if isinstance(sub, dict) else {}
        return merged
    return schema


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _message(error: jsonschema.ValidationError) -> str:
    if isinstance(error.schema, dict) and "x-message" in error.schema:
        return error.schema["x-message"]
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown key(s)")
    if error.validator == "type" and isinstance(error.schema, dict) and "x-type-message" in error.schema:
        return f"{error.instance!r} {error.schema['x-type-message']}"
    renamed = error.schema.get("x-renamed", {}) if isinstance(error.schema, dict) else {}
    if error.validator == "enum" and isinstance(error.instance, str) and error.instance in renamed:
        return f"{error.instance!r} was renamed: write {renamed[error.instance]}"
    return error.message


def from_snakemake_args(args: list[str], workflow_dir: Path) -> dict[str, Any]:
    """The validated config a ``snakemake`` command line would use (for commands that run beside
    Snakemake: redo, status, config), so they see the datasets the workflow will."""
    return validate_config(load_layers(*snakemake_layers(args, workflow_dir)))


def snakemake_layers(args: list[str], workflow_dir: Path) -> tuple[list[Path], dict[str, Any]]:
    """The config files and ``--config`` overrides of a ``snakemake`` command line."""
    parsed = snakemake_args.parse(args)
    files, entries = parsed.configfiles, parsed.config_entries
    overrides = {}
    if entries:
        from snakemake.cli import parse_config  # Snakemake's own reading of KEY=VALUE

        try:
            overrides = parse_config(entries)
        except ValueError as err:
            raise ConfigError(f"--config: {err}") from None
    return config_files(workflow_dir, files), overrides


def annotated_yaml(config: dict[str, Any], found: dict[tuple[str, ...], str], where: tuple[str, ...] = (),
                   indent: int = 0) -> list[str]:
    """``config`` as YAML lines, each value followed by its origin."""
    lines = []
    for key, value in config.items():
        path, pad = (*where, key), "  " * indent
        if isinstance(value, dict) and value:
            lines.append(f"{pad}{_inline(key)}:")
            lines += annotated_yaml(value, found, path, indent + 1)
        else:
            lines.append(f"{pad}{_inline(key)}: {_inline(value)}  # {found.get(path, DEFAULT_ORIGIN)}")
    return lines


def _inline(value: Any) -> str:
    text = yaml.safe_dump(value, default_flow_style=True, width=10**6, allow_unicode=True).strip()
    return text.removesuffix("...").strip()


REFERENCE_HEADER = ("<!-- generated from draftsmith/config/schema.yaml by "
                    "`python -m draftsmith.config.load --reference`; a test keeps it equal -->")


def reference() -> str:
    """Every key of the schema as Markdown tables, one per section: docs/configuration.md's reference."""
    lines = [REFERENCE_HEADER, "", "Operational keys (op) say how to run, not what to compute: changing them reruns "
             "nothing.", ""]
    for section, schema in SCHEMA["properties"].items():
        lines += [f"### `{section}`", ""]
        if schema.get("description"):
            lines += [schema["description"], ""]
        lines += ["| key | type | default | op | meaning |", "|---|---|---|---|---|"]
        lines += [_reference_row(key, sub) for key, sub in _leaves(schema, ())]
        lines.append("")
    return "\n".join(lines)


def _leaves(schema: dict, where: tuple[str, ...]):
    """(dotted key, schema) of every leaf; a mapping of user-named entries shows as ``<name>``."""
    schema = _resolve(schema)
    for name, sub in schema.get("properties", {}).items():
        sub = _resolve(sub) if isinstance(sub, dict) else {}
        if sub.get("type") == "object" and ("properties" in sub or _named_entries(sub)):
            yield from _leaves(sub, (*where, name))
        else:
            yield ".".join((*where, name)), sub
    if _named_entries(schema) and "properties" not in schema:
        yield from _leaves(schema["additionalProperties"], (*where, "<name>"))


def _named_entries(schema: dict) -> bool:
    """A mapping of user-named entries that have keys of their own (datasets, prompt sets); one whose
    values are plain (headers: a string or {env: NAME}) is a leaf."""
    entry = schema.get("additionalProperties")
    return isinstance(entry, dict) and "properties" in _resolve(entry)


def _reference_row(key: str, sub: dict) -> str:
    types = sub["type"] if isinstance(sub.get("type"), list) else [sub.get("type", "any")]
    kind = " \\| ".join(map(_inline, sub["enum"])) if sub.get("enum") else " or ".join(types)
    default = f"`{_inline(sub['default'])}`" if "default" in sub else "unset" if sub.get("x-unset") else "required"
    meaning = sub.get("description", "").replace("|", "\\|").replace("\n", " ")
    return f"| `{key}` | {kind} | {default} | {'op' if sub.get('x-operational') else ''} | {meaning} |"


def main(argv: list[str], workflow_dir: Path) -> int:
    """Print the effective config, each value's origin in a comment; a bad config says why.
    ``--reference``: every key of the schema as Markdown (docs/configuration.md)."""
    if argv == ["--reference"]:
        print(reference())
        return 0
    try:
        files, overrides = snakemake_layers(argv, workflow_dir)
        config = validate_config(load_layers(files, overrides))
    except ConfigError as err:
        print(f"draftsmith: {err}", file=sys.stderr)
        return 1
    print(f"# draftsmith: the effective config (layers: default, {', '.join(map(str, files))}"
          f"{', --config' if overrides else ''})")
    print("\n".join(annotated_yaml(config, origins(files, overrides))))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], WORKFLOW_DIR))

