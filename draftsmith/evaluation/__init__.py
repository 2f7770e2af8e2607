"""The drafter measured, the published setting decided, both rendered: three stages a figure walks in one direction.

- ``measure/``: serving and counting. ``methods`` says how each method is served (its speculative config, the
  engine flags a measurement ran with); ``evaluate`` starts the servers, holds each concurrency in a window, reads
  the engine's counts and judges whether a window held. Its records: ``results/evaluation/{method}.json``.
- ``decide/``: choosing from those records. ``pick`` ranks every cell per concurrency, chooses the published
  family and the setting each band serves first; ``schedule`` turns the ranking into vLLM's config for every
  batch size, with its bands. Their record: ``results/evaluation/results.json`` (``serving.json`` copies the
  schedule).
- ``render/``: formatting records. ``report`` (``results/report/report.md``) and ``model_card`` (the drafter's README)
  decide nothing of their own; each rule's wording comes from the function beside the code that applies it.

Measuring imports neither deciding nor rendering, and deciding does not import rendering
(``tests/test_layout.py``).
"""
