"""Running the workflow: preflight, plan, status, redo, job runner, GPU leases, stops, time spent."""
