"""A tool call's arguments: the one reading of them (an object, or a JSON string of one, as OpenAI
sends them) and what makes two calls' arguments the same call, so that the loader, the chat
template, the client and the pairing of results with calls agree."""

from __future__ import annotations

import json
from typing import Any


def call_arguments(value: Any) -> dict | None:
    """A call's arguments as an object: an object as it is, a JSON string of one parsed, an empty or
    blank string as ``{}`` (no arguments); None where they are not an object (each caller says what
    that means: the loader refuses the row, the template gets ``{}``, text keeps what the model wrote)."""
    if isinstance(value, str):
        if not value.strip():
            return {}
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return value if isinstance(value, dict) else None


def arguments_text(value: Any) -> str:
    """The arguments as the API's JSON string: a string kept as it came (the model's own text, even
    when it is not JSON), an object written as JSON."""
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)


def parameter_defaults(tools: list[dict] | None, name: str) -> dict[str, Any]:
    """The defaults that function ``name``'s schema declares for its top-level parameters."""
    for tool in tools or []:
        function = tool.get("function", tool)
        if function.get("name") == name:
            properties = (function.get("parameters") or {}).get("properties") or {}
            return {k: p["default"] for k, p in properties.items() if isinstance(p, dict) and "default" in p}
    return {}


def same_arguments(a: dict, b: dict, defaults: dict[str, Any]) -> bool:
    """Whether two calls of one function asked the same thing: as JSON objects, key order ignored,
    numbers by value (``1`` is ``1.0``, never ``true``), strings exact; a parameter one side leaves
    out and the other gives at the schema's default is the same. ``null`` is a value like any other, not
    "left out": the function receives None, which differs from a default of 1, so a ``null`` argument equals
    an absent one only where the schema's default is itself ``null``."""
    for key in a.keys() | b.keys():
        if key in a and key in b:
            if not same_value(a[key], b[key]):
                return False
        elif key not in defaults or not same_value(a.get(key, b.get(key)), defaults[key]):
            return False
    return True


def same_value(a: Any, b: Any) -> bool:
    """JSON equality: Python's ``==`` but a boolean is never a number."""
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(same_value(a[k], b[k]) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(same_value(x, y) for x, y in zip(a, b, strict=True))
    return type(a) is type(b) and a == b
