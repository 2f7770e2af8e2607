"""draftsmith: train EAGLE-3 drafters for a target LLM, one reproducible workflow."""

__version__ = "0.1.0"
