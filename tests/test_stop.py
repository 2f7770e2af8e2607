"""Stopping Snakemake (SIGTERM or SIGINT to its process, as a supervisor or `timeout` does) stops
the job it runs instead of letting it run to its end."""

import signal
import subprocess
import sys
import time

import pytest

from tests.conftest import REPO

JOB = """
import signal, sys, time
def stop(*_):
    open(sys.argv[1], "w").write("saved")
    sys.exit(1)
signal.signal(signal.SIGTERM, stop)
open(sys.argv[2], "w").write("started")
time.sleep(120)
"""


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_stopping_snakemake_stops_a_running_job(tmp_path, sig):
    (tmp_path / "job.py").write_text(JOB)
    # The draftsmith Snakefile's hook, in a workflow with one long job.
    (tmp_path / "Snakefile").write_text(
        "from draftsmith.ops.stop import forward_stops_to_jobs\n\n"
        "onstart:\n    forward_stops_to_jobs()\n\n"
        f"rule long:\n    output: 'out'\n    shell: '{sys.executable} job.py saved started && touch out'\n")
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", "--cores", "1"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline = time.monotonic() + 60
    while not (tmp_path / "started").exists():
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()[0]
        time.sleep(0.2)
    stopped_at = time.monotonic()
    proc.send_signal(sig)
    proc.wait(timeout=60)
    assert (tmp_path / "saved").read_text() == "saved"  # the job was told, and did its clean-up
    assert time.monotonic() - stopped_at < 30 and not (tmp_path / "out").exists()


def test_the_workflow_installs_the_hook():
    assert "forward_stops_to_jobs()" in (REPO / "Snakefile").read_text().split("onstart:")[1]
