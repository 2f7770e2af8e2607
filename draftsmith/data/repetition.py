"""How much an answer repeats itself: the share of its tokens whose last ``n`` tokens already occurred earlier
in the same answer.

A target decoding greedily, or cut at ``max_tokens``, loops (``(()()()…``, ``, 3, 4, 2, 2, 3, 4, …``), and
reasoning targets do it more at T=0 (Qwen3's own guidance warns against greedy decoding in thinking mode). A
loop is the easiest thing a drafter can predict: validation rewards it, the simulated τ that picks the
checkpoint is inflated by it, and traffic does not loop. Measured per row at tokenization over the
supervised tokens, so the report can show each dataset's distribution and ``tokenize.max_repetition`` can
drop looping answers, counted, before they are trained on.
"""

from __future__ import annotations

import statistics

NGRAM = 4  # a 4-token window: short enough to catch a short loop, long enough that ordinary text rarely repeats
# The shares the report counts rows above (what a limit there would drop).
THRESHOLDS = (0.3, 0.5, 0.7)
# A row above this share is said to loop where figures are given with and without such rows.
LOOPING = 0.5


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


def is_looping(input_ids: list[int], loss_mask: list[int]) -> bool:
    """Whether a row's answers loop (:data:`LOOPING`)."""
    return repeated_share(answer_tokens(input_ids, loss_mask)) > LOOPING


def summary(shares: list[float]) -> dict:
    """A dataset's distribution: quantiles, and the rows above each of :data:`THRESHOLDS` (what a
    ``tokenize.max_repetition`` there would drop)."""
    if not shares:
        return {"rows": 0}
    ordered = sorted(shares)
    quantiles = statistics.quantiles(ordered, n=20, method="inclusive") if len(ordered) > 1 else ordered * 19
    return {"rows": len(ordered), "ngram": NGRAM, "mean": round(statistics.fmean(ordered), 4),
            "p50": round(quantiles[9], 4), "p90": round(quantiles[17], 4), "max": round(ordered[-1], 4),
            "above": {f"{t:g}": sum(s > t for s in ordered) for t in THRESHOLDS}}
