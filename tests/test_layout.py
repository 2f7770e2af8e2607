"""The package's shape: one sub-package per concern, every import pointing down the floors below
(a stage may use what its inputs' stages own, never the other way), no module left at the top. Inside
``evaluation/`` a figure walks one way too: measured (``measure/``), decided (``decide/``), rendered (``render/``)."""

import ast
from pathlib import Path

from tests.conftest import REPO

PACKAGE = REPO / "draftsmith"
FLOORS = {"core": 0, "config": 1, "data": 2, "hidden_states": 2, "generation": 3, "training": 3,
          "evaluation": 4, "ops": 5}  # ops (preflight, plan, status) checks and counts what every stage does
# evaluation's own floors: a renderer formats what the deciding jobs recorded from what the measuring ones counted
STAGES = {"measure": 0, "decide": 1, "render": 2}


def imported_modules(module: Path) -> set[str]:
    """The draftsmith modules and packages ``module`` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(module.read_text())):
        names = [node.module or ""] if isinstance(node, ast.ImportFrom) else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        found |= {n for n in names if n.startswith("draftsmith.")}
    return found


def imported_packages(module: Path) -> set[str]:
    """The draftsmith sub-packages ``module`` imports."""
    return {name.split(".")[1] for name in imported_modules(module)}


def imported_stages(module: Path) -> set[str]:
    """The stages of ``evaluation/`` (:data:`STAGES`) ``module`` imports."""
    return {parts[2] for name in imported_modules(module)
            if len(parts := name.split(".")) > 2 and parts[1] == "evaluation"}


def floor_of(module: Path) -> str:
    return module.relative_to(PACKAGE).parts[0]


def modules() -> list[Path]:
    return [m for m in PACKAGE.rglob("*.py") if m.parent != PACKAGE]


def test_every_module_sits_in_a_sub_package_of_a_known_floor():
    assert sorted(p.name for p in PACKAGE.glob("*.py")) == ["__init__.py"]
    assert {floor_of(p) for p in modules()} == set(FLOORS)


def test_imports_only_point_down():
    upward = [f"{m.relative_to(REPO)} imports draftsmith.{dep}"
              for m in modules() for dep in imported_packages(m)
              if dep != floor_of(m) and FLOORS[dep] >= FLOORS[floor_of(m)]]
    assert not upward, upward


def test_the_check_sees_an_upward_import(tmp_path):
    module = tmp_path / "core" / "bad.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from draftsmith.ops import status\n")
    assert imported_packages(module) == {"ops"}


def test_evaluation_measures_then_decides_then_renders_and_never_climbs_back():
    """Measuring (servers, windows, counts) imports neither deciding nor rendering; deciding (the pick, the
    schedule) does not import rendering (the report, the card)."""
    evaluation = PACKAGE / "evaluation"
    assert sorted(p.name for p in evaluation.glob("*.py")) == ["__init__.py"]
    assert {p.parent.name for p in evaluation.glob("*/*.py")} == set(STAGES)
    climbs = [f"{m.relative_to(REPO)} imports draftsmith.evaluation.{stage}"
              for m in evaluation.glob("*/*.py") for stage in imported_stages(m)
              if STAGES[stage] > STAGES[m.parent.name]]
    assert not climbs, climbs


def test_the_check_sees_a_climb_back(tmp_path):
    module = tmp_path / "measure" / "bad.py"
    module.parent.mkdir()
    module.write_text("def f():\n    from draftsmith.evaluation.render import report\n"
                      "    from draftsmith.evaluation.decide import pick\n")
    assert imported_stages(module) == {"render", "decide"}


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
