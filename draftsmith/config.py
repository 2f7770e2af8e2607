"""Validate a workflow config against ``schema.yaml`` and fill in its defaults, before any job runs."""

from __future__ import annotations

import copy
from importlib.resources import files
from typing import Any

import jsonschema
import yaml

SCHEMA = yaml.safe_load(files("draftsmith").joinpath("schema.yaml").read_text())


class ConfigError(ValueError):
    pass


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
    return _sorted(config)


def _sorted(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _sorted(value[k]) for k in sorted(value)}
    if isinstance(value, list):
        return [_sorted(v) for v in value]
    return value


def _where(error: jsonschema.ValidationError) -> str:
    return ".".join(str(p) for p in error.absolute_path) or "<top level>"


def _message(error: jsonschema.ValidationError) -> str:
    if error.validator == "additionalProperties":
        return error.message.replace("Additional properties are not allowed", "unknown key(s)")
    return error.message
