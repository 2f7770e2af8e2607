"""Formatting records: the report and the model card, which decide nothing (see the package docstring)."""
