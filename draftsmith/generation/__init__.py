"""Answers from the target: inference servers, the client, resumable generation per dataset."""
