"""Prompts to training rows: datasets, decontamination, chat templates and tokenization, merge, vocabulary."""
