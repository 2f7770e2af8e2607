"""The drafter: speculators' trainer and draftsmith's patches of it, warm starts, placement, export."""
