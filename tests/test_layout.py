"""The package's shape: one sub-package per concern, every import pointing down the floors below
(a stage may use what its inputs' stages own, never the other way), no module left at the top."""

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "draftsmith"
FLOORS = {"core": 0, "config": 1, "data": 2, "hidden_states": 2, "generation": 3, "training": 3,
          "evaluation": 4, "ops": 5}  # ops (preflight, plan, status) checks and counts what every stage does


def imported_packages(module: Path) -> set[str]:
    """The draftsmith sub-packages ``module`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {n.split(".")[1] for n in names if n.startswith("draftsmith.")}
    return found


def test_every_module_sits_in_a_sub_package_of_a_known_floor():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    assert {p.parent.name for p in PACKAGE.glob("*/*.py")} == set(FLOORS)


def test_imports_only_point_down():
    upward = [f"{m.relative_to(REPO)} imports draftsmith.{dep}"
              for m in PACKAGE.glob("*/*.py") for dep in imported_packages(m)
              if dep != m.parent.name and FLOORS[dep] >= FLOORS[m.parent.name]]
    assert not upward, upward


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "core" / "bad.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from draftsmith.ops import status\n")
    assert imported_packages(module) == {"ops"}


def private_uses(module: Path) -> list[str]:
    """Another draftsmith module's private names ``module`` reaches for: ``from draftsmith.x import _name``, or
    ``_name`` read off a draftsmith module it imported (``train._eagle3_flags``, once the engine check's)."""
    tree = ast.parse(module.read_text())
    aliases, found = set(), []
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("draftsmith"):
            found += [f"{node.module}.{a.name}" for a in node.names if a.name.startswith("_")]
            aliases |= {a.asname or a.name for a in node.names}
        elif isinstance(node, ast.Import):
            aliases |= {a.asname or a.name.split(".")[0] for a in node.names if a.name.startswith("draftsmith.")}
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and node.attr.startswith("_") and not node.attr.startswith("__") \
                and isinstance(node.value, ast.Name) and node.value.id in aliases:
            found.append(f"{node.value.id}.{node.attr}")
    return found


def test_no_module_calls_another_modules_private_function():
    """A function another module needs is public, with a docstring that says who relies on it."""
    used = {str(m.relative_to(REPO)): uses for m in PACKAGE.rglob("*.py") if (uses := private_uses(m))}
    assert not used, used
