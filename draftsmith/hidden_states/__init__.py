"""The target's hidden states: extraction (vLLM or transformers), the store, vLLM's connector."""
