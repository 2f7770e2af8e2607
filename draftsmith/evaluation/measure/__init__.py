"""Serving and counting: how each method is served, and its windows measured (see the package docstring)."""
