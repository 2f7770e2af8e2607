"""The one reading of a ``snakemake`` command line by the commands that run beside Snakemake
(``./run.sh redo``, ``status``, ``config``): which config files and ``--config`` entries it
layers, which folder it works in, and whether it only previews. Everything else is left for
Snakemake itself."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

DRY_RUN_FLAGS = ("-n", "--dry-run", "--dryrun")
CONFIGFILE_FLAGS = ("--configfile", "--configfiles")
CONFIG_FLAGS = ("--config", "-C")
DIRECTORY_FLAGS = ("-d", "--directory")


@dataclass
class SnakemakeArgs:
    configfiles: list[Path] = field(default_factory=list)
    config_entries: list[str] = field(default_factory=list)  # KEY=VALUE, read by Snakemake's own parser
    directory: Path | None = None
    dry_run: bool = False


def parse(args: list[str]) -> SnakemakeArgs:
    """``--configfile``/``--config`` take every value up to the next flag (as Snakemake's do), in
    both ``--flag value`` and ``--flag=value`` forms; ``-n`` also counts among combined short
    flags (``-np``: a preview, which a redo must not take for a deletion)."""
    parsed, i = SnakemakeArgs(), 0
    while i < len(args):
        flag, eq, value = args[i].partition("=")
        if flag in CONFIGFILE_FLAGS + CONFIG_FLAGS:
            values = [value] if eq else []
            while not eq and i + 1 < len(args) and not args[i + 1].startswith("-"):
                values.append(args[i + 1])
                i += 1
            if flag in CONFIGFILE_FLAGS:
                parsed.configfiles += map(Path, values)
            else:
                parsed.config_entries += values
        elif flag in DIRECTORY_FLAGS:
            if eq:
                parsed.directory = Path(value)
            elif i + 1 < len(args):
                parsed.directory = Path(args[i + 1])
                i += 1
        elif args[i] in DRY_RUN_FLAGS or (args[i][:1] == "-" and args[i][1:2] != "-" and "n" in args[i][1:]):
            parsed.dry_run = True
        i += 1
    return parsed
