"""One deployable setting for every batch size: the published method's dynamic speculative schedule.

vLLM 0.32 serves *dynamic speculative decoding*: ``speculative_config.num_speculative_tokens_per_batch_size``
is a list of ``[first_batch, last_batch, k]`` ranges (k = 0 allowed: no drafting at those batch sizes), read
by the scheduler at every step (``vllm/v1/spec_decode/dynamic/utils.py``; ranges start at 1, do not overlap,
and the last k carries on past the last range). The serving grid measures what that schedule needs: at each
measured concurrency the published family's best draft length, or plain serving where the target alone is
faster (by the figure the recipe ranks by). Each measured concurrency stands for the batch sizes up to the
next one measured, as the model card's bands do.

A schedule whose every band drafts the same k is the fixed setting the grid already measured; one that
differs between bands is served once more and measured at every concurrency of the grid
(``rule evaluate_schedule``), since a scheduler that changes k with the batch is not the sum of its cells.
"""

from __future__ import annotations

from draftsmith.evaluation import methods
from draftsmith.evaluation.methods import PLAIN

# The end of the last range: vLLM carries the last k past it anyway, and clips every range to max_num_seqs.
LAST_BATCH = 1024


def band_starts(concurrencies: list[int]) -> list[int]:
    """The first batch size each measured concurrency stands for: 1 for the lowest, else itself."""
    points = sorted(concurrencies)
    return [1, *points[1:]]


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


def ranges(ks: dict[int, int]) -> list[list[int]]:
    """``[first_batch, last_batch, k]`` ranges from the k at each measured concurrency, neighbours with the
    same k merged, the first from batch size 1 and the last to :data:`LAST_BATCH`."""
    points = sorted(ks)
    starts = band_starts(points)
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
    spans = ranges(ks) if ks else []
    drafted = {k for _, _, k in spans}
    kind = "plain" if drafted <= {0} else "fixed" if len(drafted) == 1 else "dynamic"
    unmeasured = sorted(e["concurrency"] for e in serving
                        if not any(cell["method"] == family for cell in e.get("ranked", [])))
    return {"family": family, "k_at": {str(c): k for c, k in sorted(ks.items())}, "ranges": spans, "kind": kind,
            "max_k": max(drafted, default=0), "unmeasured": unmeasured}


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
    """The schedule in words, band by band."""
    parts = []
    for first, last, k in schedule["ranges"]:
        batches = f"{first}+" if last >= LAST_BATCH else f"{first}" if first == last else f"{first}-{last}"
        parts.append(f"batch {batches}: " + ("no speculation" if k == 0 else f"k={k}"))
    if schedule.get("unmeasured"):  # no speculation there is the safe setting, not one plain serving won
        parts.append(f"{schedule['family']} has no figure at concurrency "
                     f"{', '.join(map(str, schedule['unmeasured']))}: served there without speculation, unmeasured")
    return "; ".join(parts)

