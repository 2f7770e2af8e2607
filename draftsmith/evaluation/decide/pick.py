"""The pick: which serving setting wins at each concurrency, and which trained family becomes
``results/drafter/``, from measurements only.

Every method (each trained family, each training-free one) was measured in a job of its own, against
the target alone (in the same window on a CPU, once for the grid on GPUs), on the same prompt sets and
temperatures, at every concurrency of ``evaluation.concurrency`` and each of its draft lengths: a **cell**
is one (method,
draft length, concurrency). A cell's figure for ``pick_by`` is ``speedup``, the geometric mean of its
speed-ups over sets and temperatures (a ratio: one set twice as fast and one half as fast is no gain),
or ``tau``, the mean tokens per target step (over all steps, so that a training-free method that
drafts only where it finds a match is counted like a drafter that always drafts).

- At each concurrency the best cell of all, plain serving (the target alone: speed-up 1, one token per
  step) among them, with its margin over the best cell of another method, the best trained and the best
  training-free one, and what training bought (the trained drafter's tokens per target step over the best
  training-free method's). A cell whose runs did not hold their concurrency (:func:`~draftsmith.evaluation.
  evaluate.hold`: the client's requests in flight, the target alone's, or an engine that ran under
  :data:`~draftsmith.evaluation.measure.evaluate.HELD` of the target alone's) stands for a method only where none of its
  draft lengths held there; it is then ranked at what it delivered, with why it did not hold, and a concurrency
  where no method held says so (``nothing_held``) rather than that plain serving won.
- Where the target alone, at one concurrency, set and temperature, read speeds more than
  :data:`LOAD_TOLERANCE` apart in the windows of different methods, the machine's load changed between
  them: the speed-ups at that concurrency compare windows as much as methods, and the entry says so. That
  happens on a CPU, where each method measures its own baseline; there the ranking is by tokens per step
  (:func:`draftsmith.core.platform.ranking_figure`), which load does not touch, so no pick rests on them.
- ``results/drafter/`` is the trained family whose best cell at ``evaluation.pick_at`` is best. A family
  the engine cannot serve here, or whose export or gate failed, has no figure and is left out with its
  reason; the pick fails only when no family was measured (never for a cell that did not hold: it decides on
  what was measured and names the cell). A tie goes to the family listed first.
"""

from __future__ import annotations

import math
import shutil
from pathlib import Path

from draftsmith.core.atomic import atomic_path
from draftsmith.evaluation.measure.methods import CHAINS, PLAIN

FINETUNED = "finetuned"  # the label of the drafter this workflow trained, in its family's cells
FIGURES = {"speedup": "speed-up", "tau": "tokens per target step"}
# How far apart the target alone may read, between windows, before the load is said to have changed
# (a run's own spread on an idle machine is a few percent).
LOAD_TOLERANCE = 0.10


class NothingToPick(ValueError):
    pass


def score(runs: list[dict], pick_by: str) -> float | None:
    """A cell's figure for ``pick_by``; None when a run has none (nothing drafted, or not measured)."""
    values = [r["speedup"] if pick_by == "speedup" else (r.get("acceptance") or {}).get("tokens_per_step")
              for r in runs]
    if not values or any(v is None or v <= 0 for v in values):
        return None
    if pick_by == "speedup":
        return math.exp(sum(map(math.log, values)) / len(values))
    return sum(values) / len(values)


def figures(cell: dict) -> dict:
    """A cell's speed-up, tokens per target step and τ (vLLM's pooled per draft), over its runs, and the
    requests its engine ran on average, pooled over them (where the schedule's band starts)."""
    taus = [(r.get("acceptance") or {}).get("tau_pooled") for r in cell["runs"]]
    return {"speedup": score(cell["runs"], "speedup"), "tokens_per_step": score(cell["runs"], "tau"),
            "tau": sum(taus) / len(taus) if taus and None not in taus else None,
            "mean_running": mean_running(cell["runs"])}


def mean_running(runs: list[dict]) -> float | None:
    """The engine's running requests averaged over ``runs`` (None where a run has no reading)."""
    values = [r.get("mean_running") for r in runs]
    return sum(values) / len(values) if values and None not in values else None


def label_of(evaluation: dict) -> str:
    """The label of the cells a method is ranked by: the trained drafter's, or the method's own."""
    return FINETUNED if evaluation.get("trained") else evaluation["method"]


def held(cell: dict) -> bool:
    """Whether every run of the cell held its concurrency (runs from before this was measured did not say)."""
    return all(r.get("held", True) for r in cell["runs"])


def held_why(cell: dict) -> str | None:
    """Why the cell did not hold (its first run that did not), or None."""
    return next((r.get("held_why") or "did not hold its concurrency" for r in cell["runs"]
                 if not r.get("held", True)), None)


def best_cell(evaluation: dict, concurrency: int, pick_by: str) -> dict | None:
    """The method's best draft length at ``concurrency`` (the first listed on a tie), with its figures: among
    the cells that held there, or, where none did, among those measured, said so (``held``, ``held_why``)."""
    cells = [c for c in evaluation.get("cells", []) if c["concurrency"] == concurrency
             and c["drafter"] == label_of(evaluation)]
    scored = [(score(c["runs"], pick_by), i, c) for i, c in enumerate(cells)]
    scored = [s for s in scored if s[0] is not None]
    scored = [s for s in scored if held(s[2])] or scored
    if not scored:
        return None
    value, _, cell = max(scored, key=lambda s: (s[0], -s[1]))
    return {"method": evaluation["method"], "trained": bool(evaluation.get("trained")), "k": cell["k"],
            "concurrency": concurrency, "score": value, **figures(cell), "held": held(cell),
            "held_why": held_why(cell)}


def plain_cell(concurrency: int, running: float | None = None) -> dict:
    """Plain serving as a setting of the ranking: the target alone, against which every speed-up is taken
    (``running``: its engine's mean running requests there)."""
    return {"method": PLAIN, "trained": False, "k": 0, "concurrency": concurrency, "score": 1.0, "speedup": 1.0,
            "tokens_per_step": 1.0, "tau": None, "mean_running": running, "held": True, "held_why": None}


def baseline_running(evaluations: dict[str, dict], concurrency: int) -> float | None:
    """The target alone's engine running mean at ``concurrency``, pooled over every method's baseline runs."""
    runs = [r for e in evaluations.values() for point in e.get("baseline", []) if point["concurrency"] == concurrency
            for r in point["runs"]]
    return mean_running(runs)


def serving(evaluations: dict[str, dict], concurrencies: list[int], pick_by: str) -> list[dict]:
    """Per concurrency: every method's best cell and plain serving, ranked by ``pick_by`` (plain serving
    first on a tie: a method that merely draws level is not worth serving; methods in the listed order),
    the best with its margin over the next method, the best trained against the best training-free one, and
    the windows whose target alone disagreed (:func:`load_changes`). A cell that did not hold is ranked at what it
    delivered and listed in ``not_held``; where none held, ``nothing_held``: plain serving did not win there."""
    changes = load_changes(evaluations)
    out = []
    for c in concurrencies:
        best = [cell for e in evaluations.values() if (cell := best_cell(e, c, pick_by))]
        measured = bool(best)
        ranked = sorted([plain_cell(c, baseline_running(evaluations, c)), *best] if measured else [],
                        key=lambda cell: -cell["score"])  # stable
        entry: dict = {"concurrency": c, "ranked": ranked, "best": ranked[0] if ranked else None,
                       "not_held": [{"method": cell["method"], "k": cell["k"], "why": cell["held_why"]}
                                    for cell in best if not cell["held"]],
                       "nothing_held": measured and not any(cell["held"] for cell in best)}
        if len(ranked) > 1:
            entry["runner_up"] = ranked[1]
            entry["margin"] = ranked[0]["score"] / ranked[1]["score"] - 1
        trained = next((cell for cell in ranked if cell["trained"]), None)
        free = next((cell for cell in ranked if not cell["trained"] and cell["method"] != PLAIN), None)
        entry["best_trained"], entry["best_training_free"] = trained, free
        entry["plain_wins"] = bool(ranked and ranked[0]["method"] == PLAIN and not entry["nothing_held"])
        entry["training_free_wins"] = bool(free and ranked[0] is free and trained)
        if trained and free and trained["tokens_per_step"] and free["tokens_per_step"]:
            entry["training_bought"] = trained["tokens_per_step"] / free["tokens_per_step"] - 1
        entry["load_changed"] = [change for change in changes if change["concurrency"] == c]
        out.append(entry)
    return out


def of_sets(evaluation: dict, sets: set[str]) -> dict:
    """``evaluation`` as if only ``sets`` had been measured: each cell's and each baseline point's runs of those
    sets (runs carry their set)."""
    def keep(runs: list[dict]) -> list[dict]:
        return [r for r in runs if r["set"] in sets]

    return {**evaluation, "cells": [{**c, "runs": keep(c["runs"])} for c in evaluation.get("cells", [])],
            "baseline": [{**p, "runs": keep(p["runs"])} for p in evaluation.get("baseline", [])]}


def serving_by_workload(evaluations: dict[str, dict], concurrencies: list[int], pick_by: str,
                        workloads: dict[str, str]) -> dict[str, list[dict]]:
    """:func:`serving` per workload (``workloads``: each prompt set's), each ranked on its own sets' runs alone:
    the recipe for agent traffic need not be the one for chat. Empty with fewer than two workloads, where the
    pooled ranking is the only one."""
    sets: dict[str, set[str]] = {}
    for name, workload in workloads.items():
        sets.setdefault(workload, set()).add(name)
    if len(sets) < 2:
        return {}
    return {workload: serving({m: of_sets(e, names) for m, e in evaluations.items()}, concurrencies, pick_by)
            for workload, names in sets.items()}


def measured_runs(evaluations: dict[str, dict]) -> list[dict]:
    """Every window measured: each method's cells' runs and the target alone's (a baseline shared by every
    method once)."""
    runs = [r for e in evaluations.values() for c in e.get("cells", []) for r in c["runs"]]
    shared = [e for e in evaluations.values() if e.get("baseline_shared")][:1]
    for e in [*(e for e in evaluations.values() if not e.get("baseline_shared")), *shared]:
        runs += [r for point in e.get("baseline", []) for r in point["runs"]]
    return runs


def tool_use(evaluations: dict[str, dict]) -> dict[str, dict]:
    """Per prompt set sent with tools: the requests that carried them and the tool calls the target made in
    them, over every window measured (:func:`measured_runs`). Sets without tools, and runs from before calls
    were counted, are left out."""
    out: dict[str, dict] = {}
    for run in measured_runs(evaluations):
        if run.get("requests_with_tools"):
            counts = out.setdefault(run["set"], {"requests_with_tools": 0, "tool_calls": 0})
            counts["requests_with_tools"] += run["requests_with_tools"]
            counts["tool_calls"] += run.get("tool_calls", 0)
    return out


def derived_tokens_per_step(acceptance: dict, k: int) -> float | None:
    """Tokens per target step at draft length ``k`` from a T=0 run at a longer one, for a chain method
    (:data:`~draftsmith.evaluation.measure.methods.CHAINS`): its first ``k`` drafts are the ones it drafted, so a
    drafted step would have accepted the first ``k`` of what it accepted. With the run's tokens per step
    ``T`` and its acceptance by position ``r``: ``1 + (T - 1) * sum(r[:k]) / sum(r)``. The steps are the ones
    the longer length took, which a shorter one would place otherwise: an estimate, checked against the
    cells measured where the grid has them."""
    rates, per_step = acceptance.get("acceptance_rate_per_position") or [], acceptance.get("tokens_per_step")
    if per_step is None or not rates or None in rates or k > len(rates):
        return None
    total = sum(rates)
    return 1.0 + (per_step - 1.0) * sum(rates[:k]) / total if total else 1.0


def _mean_t0(runs: list[dict], figure) -> float | None:
    values = [figure(r) for r in runs if r["temperature"] == 0]
    return sum(values) / len(values) if values and None not in values else None


def derived_lengths(evaluations: dict[str, dict]) -> list[dict]:
    """At T=0, each chain method's tokens per step at every draft length shorter than the longest it measured
    at a concurrency (:func:`derived_tokens_per_step`, mean over sets), beside the mean its grid measured at that
    length (None where it measured none): what a grid ranked by tokens per step need not serve."""
    rows = []
    for method, evaluation in evaluations.items():
        if method not in CHAINS:
            continue
        cells = [c for c in evaluation.get("cells", []) if c["drafter"] == label_of(evaluation) and c["runs"]]
        for concurrency in sorted({c["concurrency"] for c in cells}):
            here = {c["k"]: c for c in cells if c["concurrency"] == concurrency}
            longest = here[max(here)]
            for k in range(1, longest["k"]):
                derived = _mean_t0(longest["runs"], lambda r, k=k: derived_tokens_per_step(r["acceptance"], k))
                if derived is None:
                    continue
                measured = _mean_t0(here[k]["runs"], lambda r: r["acceptance"].get("tokens_per_step")) \
                    if k in here else None
                rows.append({"method": method, "concurrency": concurrency, "k": k, "derived": derived,
                             "measured": measured})
    return rows


# The figures the pick decides from the measured records and records in results.json beside them, each with the
# function that decides it, so that the report and the card format them and decide nothing (:func:`recorded`).
RECORDED = {"tool_use": tool_use, "derived_lengths": derived_lengths}


def recorded(results: dict, figure: str):
    """One of :data:`RECORDED`'s figures as the pick recorded it in ``results`` (results from before it was
    recorded: decided now, by the same function, from the measured records they hold; nothing measured
    again)."""
    return results[figure] if figure in results else RECORDED[figure](results.get("methods") or {})


def load_changes(evaluations: dict[str, dict]) -> list[dict]:
    """Every (concurrency, set, temperature) whose target alone read speeds more than :data:`LOAD_TOLERANCE`
    apart in different methods' windows: the machine's load changed between them, and each method's
    speed-ups there divide by a baseline the others did not have. Tokens per target step, counted by the
    engine per step, do not depend on load."""
    readings: dict[tuple, dict[str, float]] = {}
    for method, evaluation in evaluations.items():
        if evaluation.get("baseline_shared"):
            continue  # one baseline for every method: nothing to disagree with
        for point in evaluation.get("baseline", []):
            for run in point["runs"]:
                if run.get("output_tok_s"):
                    readings.setdefault((point["concurrency"], run["set"], run["temperature"]), {})[method] = \
                        run["output_tok_s"]
    out = []
    for (c, name, t), tok_s in readings.items():
        spread = max(tok_s.values()) / min(tok_s.values()) - 1
        if len(tok_s) > 1 and spread > LOAD_TOLERANCE:
            out.append({"concurrency": c, "set": name, "temperature": t, "spread": spread,
                        "baseline_tok_s": {m: round(v, 1) for m, v in tok_s.items()}})
    return out


def load_changed_text() -> str:
    """:func:`load_changes`' rule in words, for every page that lists the windows it names."""
    return (f"The target alone read speeds more than {LOAD_TOLERANCE:.0%} apart at the same point in different "
            "methods' windows, so the speed-ups there divide by baselines the other methods did not have. Tokens "
            "per target step, counted by the engine, do not depend on load.")


def require_measured(evaluations: dict[str, dict], serving: list[dict], pick_by: str) -> None:
    """Refuse a side-by-side in which no method has a figure at any concurrency (every server failed, or
    every method was left out): written as "nothing measured", the job would end as a success."""
    if any(entry["best"] for entry in serving):
        return
    why = "; ".join(f"{method}: {unmeasured(evaluation, pick_by)}" for method, evaluation in evaluations.items())
    raise NothingToPick(f"no method has a measured {FIGURES[pick_by]} at any concurrency ({why})")


def unmeasured(evaluation: dict, pick_by: str) -> str:
    """Why a method has no figure: left out, or its cells' first failure."""
    cells = [c["failed"] for c in evaluation.get("cells", []) if c.get("failed")]
    return (evaluation.get("not_served") or evaluation.get("failed") or (cells[0] if cells else None)
            or f"no {FIGURES[pick_by]} measured")


def summary(family: str, evaluation: dict, training: dict, drafter_bytes: int, pick_by: str, pick_at: int) -> dict:
    """One trained family's row of the side-by-side: its best cell at ``pick_at`` (or why it has none),
    training time and size."""
    row = {"family": family, "drafter_bytes": drafter_bytes, "train_s": training.get("phases", {}).get("done_s"),
           "simulated_tau": training["chosen"].get("simulated_tau"), "draft_lengths": evaluation.get("draft_lengths")}
    for key, why in (("not_served", "not served here"), ("failed", "failed")):
        if evaluation.get(key):
            return {**row, "served": False, "excluded": why, "reason": evaluation[key], "best": None, "score": None,
                    "runs": []}
    best = best_cell(evaluation, pick_at, pick_by)
    if best is None:  # every cell there failed, or none has the figure (nothing drafted)
        failed = [c["failed"] for c in evaluation.get("cells", []) if c.get("failed") and c["concurrency"] == pick_at]
        return {**row, "served": False, "excluded": "failed" if failed else "not measured", "best": None,
                "score": None, "runs": [],
                "reason": failed[0] if failed else f"no {FIGURES[pick_by]} measured at concurrency {pick_at}"}
    return {**row, "served": True, "best": best, "score": best["score"], "runs": cell_runs(evaluation, best),
            "held": best["held"], "held_why": best["held_why"]}


def cell_runs(evaluation: dict, best: dict) -> list[dict]:
    """The runs (set, temperature) of the cell ``best`` names."""
    return next(c["runs"] for c in evaluation["cells"] if c["drafter"] == label_of(evaluation)
                and (c["k"], c["concurrency"]) == (best["k"], best["concurrency"]))


def choose(rows: list[dict], pick_by: str, pick_at: int) -> tuple[str, str]:
    ranked = sorted((r for r in rows if r["score"] is not None), key=lambda r: -r["score"])  # stable: ties keep order
    if not ranked:
        why = "; ".join(f"{r['family']}: {r.get('reason') or 'no ' + FIGURES[pick_by] + ' measured'}" for r in rows)
        raise NothingToPick(f"no family has a measured {FIGURES[pick_by]} to pick by ({why})")
    best = ranked[0]
    k = best["best"]["k"]
    name, at = FIGURES[pick_by], f"at concurrency {pick_at}, {k} draft token{'' if k == 1 else 's'}"
    if not best.get("held", True):  # decided on what was measured, the cell named
        at += f" (a cell that did not hold concurrency {pick_at}: {best['held_why']}; measured as it ran)"
    if len(ranked) == 1:
        others = [f"{r['family']} ({r.get('excluded') or 'not measured'})" for r in rows if r is not best]
        return best["family"], (f"{name} {best['score']:.3f} {at}, the only family measured"
                                + (f"; {', '.join(others)}" if others else ""))
    second = ranked[1]
    margin = best["score"] / second["score"] - 1
    return best["family"], (f"best {name} {best['score']:.3f} {at}, {margin:+.1%} over {second['family']} "
                            f"({second['score']:.3f})")


def results(evaluations: dict[str, dict], rows: list[dict], chosen: str, why: str, concurrencies: list[int],
            pick_by: str, pick_at: int, ngram: dict) -> dict:
    """``results/evaluation/results.json``: the pick, the serving table per concurrency, every family's row,
    every method's evaluation, the picked cell's runs (what the model card's acceptance table shows) and the
    figures decided from the evaluations (:data:`RECORDED`). The
    table per workload is the card's and the report's (:func:`serving_by_workload`): a label that the pick, and
    the schedule served after it, do not depend on."""
    winner, first = next(r for r in rows if r["family"] == chosen), evaluations[chosen]  # measured: it won
    return {"target": first["target"], "engine": first["engine"], "max_tokens": first["max_tokens"],
            "temperatures": first["temperatures"], "concurrency": concurrencies, "ngram": ngram,
            "compute": first.get("compute"), "seeded_sampling": first.get("seeded_sampling"),
            "on_accelerator": first.get("on_accelerator"), "device": device_of(first), "family": chosen,
            "pick": {"by": pick_by, "at": pick_at, "family": chosen, "k": winner["best"]["k"], "why": why},
            "runs": winner["runs"], "families": rows,
            "serving": [{**entry, "serve_first": first_to_serve(entry, chosen, bool(first.get("on_accelerator")))}
                        for entry in serving(evaluations, concurrencies, pick_by)],
            "load_changed": load_changes(evaluations), "methods": evaluations,
            **{figure: decide(evaluations) for figure, decide in RECORDED.items()}}


def first_to_serve(entry: dict, family: str, accelerator: bool) -> dict | None:
    """The setting to serve before ``family``'s drafter at one concurrency (the card's first command there): the
    first ranked above it that needs no drafter, plain serving only on an accelerator (a CPU's ranking says
    nothing of speed); none where no method held the concurrency."""
    if entry.get("nothing_held"):
        return None
    ranked = entry.get("ranked", [])
    ours = next((cell for cell in ranked if cell["method"] == family), None)
    above = ranked[:ranked.index(ours)] if ours is not None else ranked
    return next((c for c in above if not c["trained"] and (accelerator or c["method"] != PLAIN)), None)


def serve_first_text(accelerator: bool) -> str:
    """:func:`first_to_serve`'s rule in words, for the card's first screen."""
    among = "a training-free method, or plain serving" if accelerator else "a training-free method"
    return (f"In each band the best-ranked setting that needs no drafter ({among}) comes first where it ranked "
            "above this drafter; this drafter's own command follows.")


def serve_first(entry: dict, family: str, accelerator: bool) -> dict | None:
    """:func:`first_to_serve` as the pick recorded it in ``entry`` (results from before it was recorded: decided
    from the same ranking now, nothing measured again)."""
    return entry["serve_first"] if "serve_first" in entry else first_to_serve(entry, family, accelerator)


def device_of(evaluation: dict) -> str:
    """The device the measurement's servers computed on (evaluations from before it was recorded say only
    whether there was an accelerator)."""
    return evaluation.get("device") or ("cuda" if evaluation.get("on_accelerator") else "cpu")


def measured_on(evaluations: dict[str, dict]) -> str:
    """The device of the grid: that of the first method measured (one left out, its gate failed or not served
    here, started no server)."""
    measured = [e for e in evaluations.values() if e.get("cells")] or list(evaluations.values())
    return device_of(measured[0])


def copy_drafter(source: Path, dest: Path) -> None:
    """Copy one family's exported file or folder into ``results/drafter/``, atomically."""
    with atomic_path(dest) as tmp:
        if source.is_dir():
            shutil.copytree(source, tmp)
        else:
            shutil.copyfile(source, tmp)
