"""The pick: which trained family becomes ``results/drafter/``, from measurements only.

Each family was served and measured on the same prompt sets, temperatures and concurrency as the
target alone. ``speedup`` ranks them by the geometric mean of their speed-ups over those runs (a
ratio: one set twice as fast and one half as fast is no gain), ``tau`` by the mean pooled acceptance
length. A family the engine cannot serve here has no figure and is never picked; a tie goes to the
family listed first in ``train.families``.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from draftsmith.core.atomic import atomic_path

FINETUNED = "finetuned"  # the evaluation's label for the drafter this workflow trained


class NothingToPick(ValueError):
    pass


def family_runs(evaluation: dict) -> list[dict]:
    """Per (set, temperature): the trained drafter's τ, tok/s, speed-up and acceptance by position."""
    out = []
    for run in evaluation["runs"]:
        measured = run["drafters"][FINETUNED]
        out.append({"set": run["set"], "temperature": run["temperature"], "tau": measured["acceptance"]["tau_pooled"],
                    "output_tok_s": measured["output_tok_s"], "speedup": measured["speedup"],
                    "acceptance_rate_per_position": measured["acceptance"]["acceptance_rate_per_position"]})
    return out


def score(runs: list[dict], pick_by: str) -> float | None:
    """The family's figure for ``pick_by``; None when a run has none (nothing drafted, or not measured)."""
    values = [r["speedup" if pick_by == "speedup" else "tau"] for r in runs]
    if not values or any(v is None or v <= 0 for v in values):
        return None
    if pick_by == "speedup":
        return math.exp(sum(map(math.log, values)) / len(values))
    return sum(values) / len(values)


def summary(family: str, evaluation: dict, training: dict, drafter_bytes: int, pick_by: str) -> dict:
    """One family's row of the side-by-side: its measured runs (or why none), training time and size."""
    row = {"family": family, "drafter_bytes": drafter_bytes, "train_s": training.get("phases", {}).get("done_s"),
           "simulated_tau": training["chosen"].get("simulated_tau"), "num_speculative_tokens":
           evaluation.get("num_speculative_tokens")}
    if evaluation.get("not_served"):
        return {**row, "served": False, "reason": evaluation["not_served"], "runs": [], "score": None}
    runs = family_runs(evaluation)
    return {**row, "served": True, "runs": runs, "score": score(runs, pick_by)}


def choose(rows: list[dict], pick_by: str) -> tuple[str, str]:
    """The picked family and why, with the margin over the next one."""
    ranked = sorted((r for r in rows if r["score"] is not None), key=lambda r: -r["score"])  # stable: ties keep order
    if not ranked:
        why = "; ".join(f"{r['family']}: {r.get('reason') or 'no ' + pick_by + ' measured'}" for r in rows)
        raise NothingToPick(f"no family has a measured {pick_by} to pick by ({why})")
    best = ranked[0]
    name = "speed-up" if pick_by == "speedup" else "τ"
    if len(ranked) == 1:
        others = [r["family"] for r in rows if r is not best]
        return best["family"], (f"{name} {best['score']:.3f}, the only family measured"
                                + (f" ({', '.join(others)} not measured)" if others else ""))
    second = ranked[1]
    margin = best["score"] / second["score"] - 1
    return best["family"], (f"best {name} {best['score']:.3f}, {margin:+.1%} over {second['family']} "
                            f"({second['score']:.3f})")


def copy_drafter(source: Path, dest: Path) -> None:
    """Copy one family's exported file or folder into ``results/drafter/``, atomically."""
    with atomic_path(dest) as tmp:
        if source.is_dir():
            shutil.copytree(source, tmp)
        else:
            shutil.copyfile(source, tmp)
