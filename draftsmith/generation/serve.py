"""A long-running inference server for clusters: one job per node serves the target, many
generate jobs share it (a 1T model is loaded once per node, not once per dataset).

    sbatch --gpus=8 --wrap ".venv-gpu/bin/python -m draftsmith.generation.serve \\
        results/servers/$(hostname).url --configfile my.yaml"

The server is started from the workflow's own config (``server`` and ``generation_server``), its
URL (``http://<this host>:<port>/v1``) is written to the given file once it answers ``/health``,
and the file is removed when the job ends (scancel, time limit, crash of the server). Generate
jobs read every file matching ``generation_server.url_files`` when they start.
"""

from __future__ import annotations

import argparse
import logging
import signal
import socket
import sys
import threading
from pathlib import Path

from draftsmith.config.load import WORKFLOW_DIR, config_files, load_layers, validate_config
from draftsmith.config.target import resolve
from draftsmith.core.atomic import write_text
from draftsmith.generation.server import generation_spec, managed_server


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("url_file", type=Path)
    parser.add_argument("--configfile", type=Path, action="append", default=[])
    parser.add_argument("--log", type=Path, default=None)
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    config = validate_config(load_layers(config_files(WORKFLOW_DIR, args.configfile), {}))
    target = resolve(config["target"], WORKFLOW_DIR)
    # the target's tool-call parser whenever set: the generate jobs sharing this server may send tools
    spec = generation_spec(target, config["server"], config["generation_server"], config["target"]["tool_call_parser"])
    spec.host = "0.0.0.0"  # reachable from the other nodes
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    log = args.log or args.url_file.with_suffix(".server.log")
    with managed_server(spec, log) as server:
        port = server.base_url.rsplit(":", 1)[1].split("/")[0]
        url = f"http://{socket.getfqdn()}:{port}/v1"
        write_text(args.url_file, url + "\n")
        print(f"draftsmith serve: {url} (published in {args.url_file})", flush=True)
        try:
            while not stop.wait(5):
                message = server.exit_message()
                if message:
                    raise SystemExit(f"draftsmith serve: {message}")
        finally:
            args.url_file.unlink(missing_ok=True)


if __name__ == "__main__":
    main(sys.argv[1:])
