"""One deployable setting for every batch size: the published method's dynamic speculative schedule.

vLLM 0.32 serves *dynamic speculative decoding*: ``speculative_config.num_speculative_tokens_per_batch_size``
is a list of ``[first_batch, last_batch, k]`` ranges (k = 0 allowed: no drafting at those batch sizes), read
by the scheduler at every step (``vllm/v1/spec_decode/dynamic/utils.py``; ranges start at 1, do not overlap,
and the last k carries on past the last range). The serving grid measures what that schedule needs: at each
measured concurrency the published family's best draft length, or plain serving where the target alone is
faster (by the figure the recipe ranks by).

vLLM picks k from the requests scheduled in a step, which sits below the client's concurrency while requests
wait for their prefill (an engine mean of 7.9 at concurrency 12). So each measured concurrency's band starts
where its engine ran: the mean running count of the served cell there, pooled over the prompt sets (the
concurrency itself where the engine was not read), up to the next band's start; the model card's bands follow
the same edges. Batch sizes above the largest concurrency measured keep its k (vLLM needs one) and are named
unmeasured, as is a band whose cell did not hold its concurrency (:func:`draftsmith.evaluation.decide.pick.serving`).

A schedule whose every band drafts the same k is the fixed setting the grid already measured; one that
differs between bands is served once more and measured at every concurrency of the grid
(``rule evaluate_schedule``), since a scheduler that changes k with the batch is not the sum of its cells.
"""

from __future__ import annotations

import itertools
import math

from draftsmith.evaluation.measure import methods
from draftsmith.evaluation.measure.methods import DISPLAY_NAME, PLAIN

# The end of the last range: vLLM carries the last k past it anyway, and clips every range to max_num_seqs.
LAST_BATCH = 1024


def band_starts(concurrencies: list[int], running: dict[int, float | None] | None = None) -> list[int]:
    """The first batch size each measured concurrency stands for: 1 for the lowest, else the engine's mean
    running count there (``running``, rounded to the nearest) or, without one, the concurrency itself; each
    start above the one before."""
    points, starts = sorted(concurrencies), [1]
    for c in points[1:]:
        engine = (running or {}).get(c)
        starts.append(max(starts[-1] + 1, math.floor(engine + 0.5) if engine is not None else c))
    return starts


def served_running(serving: list[dict], family: str, ks: dict[int, int]) -> dict[int, float | None]:
    """The engine's mean running count at each measured concurrency in the cell the schedule serves there:
    the family's at its k, or the target alone's where it drafts nothing."""
    out = {}
    for entry in serving:
        method = family if ks.get(entry["concurrency"]) else PLAIN
        cell = next((cell for cell in entry.get("ranked", []) if cell["method"] == method), None)
        out[entry["concurrency"]] = (cell or {}).get("mean_running")
    return out


def per_concurrency(serving: list[dict], family: str) -> dict[int, int]:
    """The published family's draft length at each measured concurrency: its best cell, or 0 where plain
    serving ranked above it (a concurrency where the family has no figure drafts nothing)."""
    out = {}
    for entry in serving:
        ranked = entry.get("ranked", [])
        ours = next((i for i, cell in enumerate(ranked) if cell["method"] == family), None)
        plain = next((i for i, cell in enumerate(ranked) if cell["method"] == PLAIN), None)
        out[entry["concurrency"]] = 0 if ours is None or (plain is not None and plain < ours) else ranked[ours]["k"]
    return out


def ranges(ks: dict[int, int], starts: list[int] | None = None) -> list[list[int]]:
    """``[first_batch, last_batch, k]`` ranges from the k at each measured concurrency, each from its band's
    start (:func:`band_starts`; the concurrencies' own without), neighbours with the same k merged, the first
    from batch size 1 and the last to :data:`LAST_BATCH`."""
    points = sorted(ks)
    starts = starts or band_starts(points)
    ends = [nxt - 1 for nxt in starts[1:]] + [max(LAST_BATCH, points[-1])]
    out: list[list[int]] = []
    for start, end, c in zip(starts, ends, points, strict=True):
        if out and out[-1][2] == ks[c]:
            out[-1][1] = end
        else:
            out.append([start, end, ks[c]])
    return out


def build(serving: list[dict], family: str) -> dict:
    """The published family's schedule: its ranges, the k per measured concurrency, and what it is: ``plain``
    (no band drafts: serve without speculation), ``fixed`` (one k everywhere: the grid's own cells measured
    it) or ``dynamic`` (measured once more, served as one config)."""
    ks = per_concurrency(serving, family)
    running = served_running(serving, family, ks)
    starts = band_starts(list(ks), running) if ks else []
    spans = ranges(ks, starts) if ks else []
    drafted = {k for _, _, k in spans}
    kind = "plain" if drafted <= {0} else "fixed" if len(drafted) == 1 else "dynamic"
    unmeasured = sorted(e["concurrency"] for e in serving
                        if not any(cell["method"] == family for cell in e.get("ranked", [])))
    plan = {"family": family, "k_at": {str(c): k for c, k in sorted(ks.items())}, "ranges": spans, "kind": kind,
            "max_k": max(drafted, default=0), "unmeasured": unmeasured,
            "starts": {str(c): start for c, start in zip(sorted(ks), starts, strict=True)},
            "starts_from": {str(c): "engine" if running.get(c) is not None else "concurrency" for c in sorted(ks)},
            "running": {str(c): None if running.get(c) is None else round(running[c], 2) for c in sorted(ks)},
            "not_held": not_held(serving, family),
            "unmeasured_above": {"from": max(ks) + 1, "k": ks[max(ks)]} if ks and max(ks) < LAST_BATCH else None,
            "beaten_by": best_single(serving, family)}
    return {**plan, "bands": bands(plan, sorted(ks))}


def not_held(serving: list[dict], family: str) -> dict[str, str]:
    """The measured concurrencies whose band did not hold: where the family's served cell did not, or no
    method's did (its k there is what was measured, not what held)."""
    out = {}
    for entry in serving:
        ours = next((n for n in entry.get("not_held", []) if n["method"] == family), None)
        if entry.get("nothing_held") or ours:
            out[str(entry["concurrency"])] = (ours or entry["not_held"][0])["why"] or "did not hold"
    return out


def best_single(serving: list[dict], family: str) -> dict | None:
    """The training-free method ranked above ``family`` at every measured concurrency, at its most frequent best
    draft length (the one best at the most bands; the larger on a tie), or None: then the family's schedule is
    the best single config. Of several, the one ranked highest on the most bands."""
    entries = [e for e in serving if e.get("ranked")]
    if not entries:
        return None
    ahead: dict[str, list[tuple[int, int]]] = {}
    for entry in entries:
        ranked = entry["ranked"]
        ours = next((i for i, cell in enumerate(ranked) if cell["method"] == family), len(ranked))
        for i, cell in enumerate(ranked[:ours]):
            if not cell["trained"] and cell["method"] != PLAIN:
                ahead.setdefault(cell["method"], []).append((i, cell["k"]))
    everywhere = {m: seen for m, seen in ahead.items() if len(seen) == len(entries)}
    if not everywhere:
        return None
    method = min(everywhere, key=lambda m: sum(i for i, _ in everywhere[m]))  # ties: the first listed
    ks = [k for _, k in everywhere[method]]
    return {"method": method, "k": max(set(ks), key=lambda k: (ks.count(k), k))}


def beaten_by(schedule: dict, serving: list[dict]) -> dict | None:
    """The training-free method that is the best single config in place of the schedule's family
    (:func:`best_single`, as the pick recorded it; schedules from before it was recorded: from the serving table
    they were built from, nothing measured again)."""
    return schedule["beaten_by"] if "beaten_by" in schedule else best_single(serving, schedule["family"])


def one_config_text(schedule: dict, serving: list[dict]) -> str:
    """Which single config serves every batch size best, in words: the only wording of it (report, card and
    ``serving.json``'s ``described`` all say this)."""
    family = DISPLAY_NAME.get(schedule["family"], schedule["family"])
    single = beaten_by(schedule, serving)
    if single is None and schedule["kind"] == "plain":
        return "The best single config for every batch size is plain serving, without speculation."
    if single is None:
        return f"The best single config for every batch size is {family}'s schedule ({schedule['kind']})."
    k = single["k"]
    return (f"{DISPLAY_NAME.get(single['method'], single['method'])} with {k} draft token{'' if k == 1 else 's'}, "
            f"which needs no drafter, beat {family} at every measured concurrency: it is the best single config "
            f"for every batch size, and {family}'s own schedule is for those who serve the drafter anyway.")


def bands(schedule: dict | None, concurrencies: list[int]) -> list[dict]:
    """Each measured concurrency's band of batch sizes, as the schedule's ranges start them (:func:`band_starts`):
    ``first`` and ``last`` batch size, the ``concurrency`` it was measured at, the engine's mean ``running``
    there, and whether batch sizes above it are unmeasured (the last). :func:`build` records them in the schedule,
    and every page reads that record; a schedule from before it did has them drawn from its ranges here."""
    points = sorted(concurrencies)
    recorded = (schedule or {}).get("bands") or []
    if [band["concurrency"] for band in recorded] == points:
        return recorded
    starts = _starts_of(schedule or {}, points)
    running = (schedule or {}).get("running") or {}
    return [{"first": first, "last": starts[i + 1] - 1 if i + 1 < len(points) else c, "concurrency": c,
             "running": running.get(str(c)), "unmeasured_above": i + 1 == len(points)}
            for i, (first, c) in enumerate(zip(starts, points, strict=True))]


def _starts_of(schedule: dict, points: list[int]) -> list[int]:
    """Each band's first batch size: as the schedule recorded them, else where its ranges change k (a schedule
    from before it recorded its starts; bands its ranges merged start at their concurrency), else each band from
    its concurrency (no schedule), as :func:`ranges` drew them."""
    recorded, k_at = schedule.get("starts") or {}, schedule.get("k_at") or {}
    if [int(c) for c in recorded] == points:
        return [recorded[str(c)] for c in points]
    if [int(c) for c in k_at] != points or not schedule.get("ranges"):
        return band_starts(points)
    edges, starts = iter(r[0] for r in schedule["ranges"][1:]), [1]
    for before, c in itertools.pairwise(points):
        start = next(edges, c) if k_at[str(before)] != k_at[str(c)] else c
        starts.append(max(starts[-1] + 1, start))
    return starts


def band_text(band: dict) -> str:
    """A band's batch sizes in words, with where it was measured (the card's headings; :func:`describe`'s
    ranges start at the same batch sizes)."""
    first, last, c = band["first"], band["last"], band["concurrency"]
    span = f"batch size {first}" if first == last else f"batch sizes {first} to {last}"
    ran = f", where the engine ran {band['running']:.1f} on average" \
        if band["running"] is not None and band["first"] > 1 else ""
    return (f"{span} (measured at concurrency {c}{ran})"
            + (f"; above {c} unmeasured, served at its setting" if band["unmeasured_above"] else ""))


def unmeasured_text(plan: dict) -> str:
    """A fixed or plain schedule's batch sizes that no cell measured as held: above the largest concurrency
    measured, and the concurrencies that did not hold (a dynamic schedule's :func:`band_parts` names them)."""
    above = plan.get("unmeasured_above")
    said = [f" Batch sizes from {above['from']} up are unmeasured (the largest concurrency measured was "
            f"{above['from'] - 1}): vLLM serves them at the same setting."] if above else []
    said += [f" Concurrency {c} did not hold ({why}): unmeasured." for c, why in (plan.get("not_held") or {}).items()]
    return "".join(said)


def speculative_config(schedule: dict, drafter: str, evaluation: dict) -> dict | None:
    """vLLM's ``--speculative-config`` serving ``schedule`` with the drafter in ``drafter`` (None: plain serving).
    A block family's cells have one k, its trained block, so its schedule drafts that or nothing."""
    if schedule["kind"] == "plain":
        return None
    config = methods.speculative_config(schedule["family"], schedule["max_k"], evaluation, drafter)
    if schedule["kind"] == "dynamic":
        config["num_speculative_tokens_per_batch_size"] = [list(r) for r in schedule["ranges"]]
    return config


def describe(schedule: dict) -> str:
    """The schedule in words as ``serving.json`` and the pick's log hold it: where a training-free method beat its
    family everywhere, that first (the file then says which config won), then :func:`describe_bands`."""
    lead = one_config_text(schedule, []).removesuffix(".") + "; " if schedule.get("beaten_by") else ""
    return lead + describe_bands(schedule)


def describe_bands(schedule: dict) -> str:
    """The schedule in words, band by band (:func:`band_parts`)."""
    return "; ".join(band_parts(schedule))


def band_parts(schedule: dict) -> list[str]:
    """The schedule band by band, one phrase each: those that did not hold, and the batch sizes above the largest
    concurrency measured, named unmeasured."""
    parts = []
    above = schedule.get("unmeasured_above")  # schedules from before it was recorded: none
    for first, last, k in schedule["ranges"]:
        end = min(last, above["from"] - 1) if above else last
        batches = f"{first}+" if end >= LAST_BATCH else f"{first}" if first == end else f"{first}-{end}"
        parts.append(f"batch {batches}: " + ("no speculation" if k == 0 else f"k={k}"))
    if above:
        k = above["k"]
        parts.append(f"batch {above['from']}+: " + ("no speculation" if k == 0 else f"k={k}")
                     + f", unmeasured (the largest concurrency measured was {above['from'] - 1})")
    for c, why in (schedule.get("not_held") or {}).items():
        parts.append(f"concurrency {c} did not hold ({why}): its band is unmeasured, served as it was measured")
    if schedule.get("unmeasured"):  # no speculation there is the safe setting, not one plain serving won
        parts.append(f"{schedule['family']} has no figure at concurrency "
                     f"{', '.join(map(str, schedule['unmeasured']))}: served there without speculation, unmeasured")
    return parts

