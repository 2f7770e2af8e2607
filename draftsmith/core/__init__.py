"""The building blocks every stage uses: atomic writes, content digests, the compute choice."""
