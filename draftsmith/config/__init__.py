"""The workflow configuration (schema, layers, validation) and what it resolves: the target, its layers."""
