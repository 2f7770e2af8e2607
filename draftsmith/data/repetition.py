"""How much an answer loops: the share of its tokens that repeat the span just before them, back to back
(:func:`looping_share`), the one measure of looping.

A target decoding greedily, or cut at ``max_tokens``, loops (``(()()()…``, ``, 3, 4, 2, 2, 3, 4, …``), and
reasoning targets do it more at T=0 (Qwen3's own guidance warns against greedy decoding in thinking mode). A
loop is the easiest thing a drafter can predict: validation rewards it, the simulated τ that picks the
checkpoint is inflated by it, and traffic does not loop. Measured per row at tokenization over the
supervised tokens, so the report can show each dataset's distribution and ``tokenize.max_looping`` can drop
looping answers, counted, before they are trained on; the replay's "without looping rows" leaves out the rows
above :data:`CYCLE_LOOPING` (:func:`is_looping`).

The 4-gram share (:func:`repeated_share`) is what ``tokenize.max_repetition``, deprecated, still drops by, and what
projects tokenized before the span measure recorded.
"""

from __future__ import annotations

import statistics

import numpy as np

NGRAM = 4  # a 4-token window: short enough to catch a short loop, long enough that ordinary text rarely repeats
# The shares the report counts rows above (what a limit there would drop).
THRESHOLDS = (0.3, 0.5, 0.7)


def repeated_share(tokens: list[int], n: int = NGRAM) -> float:
    """The share of ``tokens``' positions (from the ``n``-th on) whose last ``n`` tokens occurred earlier."""
    seen: set[tuple[int, ...]] = set()
    repeated = counted = 0
    for end in range(n, len(tokens) + 1):
        window = tuple(tokens[end - n:end])
        counted += 1
        repeated += window in seen
        seen.add(window)
    return repeated / counted if counted else 0.0


def answer_tokens(input_ids: list[int], loss_mask: list[int]) -> list[int]:
    """The supervised tokens of a row, in order (the answers; a multi-turn row's turns one after another)."""
    return [token for token, supervised in zip(input_ids, loss_mask, strict=True) if supervised]


# A cycle: a span of up to MAX_PERIOD tokens repeated back to back, over at least MIN_CYCLE tokens (a closing
# `}\n}` or a table rule repeats back to back too, briefly). A row whose turns are more than CYCLE_LOOPING
# cycles is said to loop.
MAX_PERIOD = 256
MIN_CYCLE = 16
CYCLE_LOOPING = 0.25


def cycled_share(tokens: list[int]) -> float:
    """The share of ``tokens`` that repeat the span just before them, back to back (a cycle of a period up to
    :data:`MAX_PERIOD`, repeated for :data:`MIN_CYCLE` tokens and a whole period at least).

    Why not :func:`repeated_share`: a 4-gram seen anywhere earlier grows with length and with structure, not
    with looping (human ShareGPT answers: 0.1% flagged under 256 tokens, 9.3% at 1-4K, most of them code,
    configs, logs and CSV). A loop is what greedy decoding does: the same span again, right after itself."""
    ids = np.asarray(tokens)
    covered = np.zeros(len(ids), dtype=bool)
    for period in range(1, min(MAX_PERIOD, len(ids) // 2) + 1):
        same = np.concatenate([[False], ids[period:] == ids[:-period], [False]])  # same[i + 1]: i + period is i
        edges = np.flatnonzero(np.diff(same.astype(np.int8)))
        for start, end in zip(edges[::2], edges[1::2], strict=True):
            if end - start >= max(period, MIN_CYCLE):
                covered[start + period:end + period] = True
    return float(covered.mean()) if len(ids) else 0.0


def turn_tokens(input_ids: list[int], loss_mask: list[int]) -> list[list[int]]:
    """The supervised runs of a row (its answer turns), each on its own: an agent's turns, each a tool call
    like the last, are not one span repeated back to back."""
    runs: list[list[int]] = []
    previous = 0
    for token, supervised in zip(input_ids, loss_mask, strict=True):
        if supervised:
            if not previous:
                runs.append([])
            runs[-1].append(token)
        previous = supervised
    return runs


def looping_share(input_ids: list[int], loss_mask: list[int]) -> float:
    """The share of a row's answer tokens that cycle (:func:`cycled_share`, each turn on its own): the one
    measure of looping, which ``tokenize.max_looping`` drops by and :func:`is_looping` judges."""
    turns = turn_tokens(input_ids, loss_mask)
    answered = sum(map(len, turns))
    return sum(cycled_share(t) * len(t) for t in turns) / answered if answered else 0.0


def is_looping(input_ids: list[int], loss_mask: list[int]) -> bool:
    """Whether a row's answers loop: more than :data:`CYCLE_LOOPING` of their tokens cycle (:func:`looping_share`).
    What the replay's "without looping rows" subset, which chooses the checkpoint, leaves out."""
    return looping_share(input_ids, loss_mask) > CYCLE_LOOPING


# The span shares the report counts rows above (what a tokenize.max_looping there would drop).
LOOPING_THRESHOLDS = (0.1, CYCLE_LOOPING, 0.5)


def looping_conditions() -> dict:
    """What the span measure's figures depend on, recorded beside them by the tokenize job (the record's
    conditions: :func:`looping_text` words a finished project's as they were)."""
    return {"max_period": MAX_PERIOD, "min_cycle": MIN_CYCLE, "looping_above": CYCLE_LOOPING}


def looping_text(recorded: dict | None = None) -> str:
    """The looping measure in words, for the report's table of it: as ``recorded`` (a dataset's ``looping``
    stats) says it was measured; stats from before the conditions were recorded were measured by these."""
    said = {**looping_conditions(), **{k: v for k, v in (recorded or {}).items() if k in looping_conditions()}}
    return (f"Share of each answer's tokens that repeat the span just before them, back to back: a span of up to "
            f"{said['max_period']} tokens repeated over {said['min_cycle']} tokens at least, each turn on its own. "
            f"Above {said['looping_above']:g} a row is left out of the replay's figures without looping rows.")


def summary(shares: list[float], thresholds: tuple[float, ...] = THRESHOLDS, **measure) -> dict:
    """A dataset's distribution: quantiles, and the rows above each of ``thresholds`` (what a limit there would
    drop); ``measure``: what the shares are of (``ngram``: the 4-gram share's window)."""
    if not shares:
        return {"rows": 0}
    ordered = sorted(shares)
    quantiles = statistics.quantiles(ordered, n=20, method="inclusive") if len(ordered) > 1 else ordered * 19
    return {"rows": len(ordered), **measure, "mean": round(statistics.fmean(ordered), 4),
            "p50": round(quantiles[9], 4), "p90": round(quantiles[17], 4), "max": round(ordered[-1], 4),
            "above": {f"{t:g}": sum(s > t for s in ordered) for t in thresholds}}
