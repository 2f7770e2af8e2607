"""The drafter measured: acceptance length and speed-up on a live server, the report, the model card."""
