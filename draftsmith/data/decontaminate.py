"""Choose the prompts a dataset sends to the target: no evaluation prompt, no duplicate.

Runs before generation, so no GPU time is spent on a prompt that would leak an evaluation
prompt into training or that another dataset already answers. A training prompt is dropped when

- one of its turns equals an evaluation prompt's turn with case and whitespace folded: ``exact``;
- its word n-grams overlap an evaluation prompt's: ``|A ∩ B| / min(|A|, |B|) >= max_overlap``
  over the n-gram sets of the two texts (texts shorter than ``n`` words are compared exactly
  only): ``ngram``;
- the same prompt (all turns, case and whitespace folded) is in an earlier dataset (datasets in
  name order) or earlier in this one: ``duplicate``.

Punctuation counts for ``exact`` and ``duplicate`` (``correct_bracketing("(")`` and
``correct_bracketing("<")`` are different code tasks) and is ignored by the n-gram test.

Every drop is counted per reason, with examples, in the dataset's prompt stats.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from dataclasses import dataclass, field

from draftsmith.data.datasets import Prompt

_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def normalize(text: str) -> str:
    return " ".join(text.lower().split())


def ngrams(text: str, n: int) -> set[tuple[str, ...]]:
    words = _WORD.findall(text.lower())
    return {tuple(words[i:i + n]) for i in range(len(words) - n + 1)}


def prompt_key(prompt: Prompt) -> str:
    return "\x1f".join(normalize(t) for t in [prompt.system or "", *prompt.turns])


@dataclass
class EvaluationIndex:
    """Evaluation prompts, indexed for exact and n-gram lookups."""

    n: int
    exact: dict[str, str] = field(default_factory=dict)
    grams: list[tuple[str, set]] = field(default_factory=list)
    by_gram: dict[tuple, list[int]] = field(default_factory=lambda: defaultdict(list))

    @classmethod
    def build(cls, sets: dict[str, list[Prompt]], n: int) -> EvaluationIndex:
        index = cls(n)
        for set_name, prompts in sets.items():
            for prompt in prompts:
                label = f"{set_name}/{prompt.id}"
                for turn in prompt.turns:
                    index.exact.setdefault(normalize(turn), label)
                    grams = ngrams(turn, n)
                    if grams:
                        for gram in grams:
                            index.by_gram[gram].append(len(index.grams))
                        index.grams.append((label, grams))
        return index

    def match(self, prompt: Prompt, max_overlap: float) -> tuple[str, str, float] | None:
        """``(reason, evaluation prompt, overlap)`` of the first match, or None."""
        for turn in prompt.turns:
            label = self.exact.get(normalize(turn))
            if label:
                return "exact", label, 1.0
        for turn in prompt.turns:
            grams = ngrams(turn, self.n)
            shared = Counter(i for gram in grams for i in set(self.by_gram.get(gram, ())))
            for i, count in shared.items():
                label, other = self.grams[i]
                overlap = count / min(len(grams), len(other))
                if overlap >= max_overlap:
                    return "ngram", label, overlap
        return None


@dataclass
class Selection:
    kept: list[Prompt]
    dropped: Counter
    examples: list[dict]

    def stats(self) -> dict:
        return {"kept": len(self.kept), "dropped": dict(self.dropped), "examples": self.examples}


def select(prompts: list[Prompt], index: EvaluationIndex | None, max_overlap: float,
           earlier: dict[str, str] | None) -> Selection:
    """Drop evaluation matches (``index``) and duplicates of ``earlier`` prompts (key -> dataset)."""
    seen: dict[str, str] = dict(earlier or {})
    kept, dropped, examples = [], Counter(), []
    for prompt in prompts:
        key = prompt_key(prompt)
        hit = index.match(prompt, max_overlap) if index else None
        if hit is None and key in seen:
            hit = ("duplicate", seen[key], 1.0)
        if hit:
            reason, other, overlap = hit
            dropped[reason] += 1
            if len(examples) < 10:
                examples.append({"id": prompt.id, "reason": reason, "matches": other, "overlap": round(overlap, 3),
                                 "prompt": prompt.turns[0][:200]})
            continue
        seen[key] = f"this dataset/{prompt.id}"
        kept.append(prompt)
    return Selection(kept, dropped, examples)
