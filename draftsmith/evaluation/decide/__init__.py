"""Choosing from the measured records: the pick, the serving table and the schedule (see the package docstring)."""
