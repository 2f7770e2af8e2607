"""The commands beside Snakemake read its command line as Snakemake does."""

from pathlib import Path

import pytest

from draftsmith.config.snakemake_args import SnakemakeArgs, parse


@pytest.mark.parametrize("argv, expected", [
    (["--configfile", "a.yaml", "b.yaml", "-n"], SnakemakeArgs([Path("a.yaml"), Path("b.yaml")], dry_run=True)),
    (["--configfile=a.yaml", "b.yaml"], SnakemakeArgs([Path("a.yaml")])),  # '=' takes one value; b.yaml is a target
    (["--configfiles", "a.yaml", "--config", "x=1", "y=2", "-j2"], SnakemakeArgs([Path("a.yaml")], ["x=1", "y=2"])),
    (["-C", "x=1", "--config=y=2"], SnakemakeArgs(config_entries=["x=1", "y=2"])),
    (["-d", "w", "-np"], SnakemakeArgs(directory=Path("w"), dry_run=True)),
    (["--directory=w", "--dry-run"], SnakemakeArgs(directory=Path("w"), dry_run=True)),
    (["--directory", "w", "-p", "--notemp"], SnakemakeArgs(directory=Path("w"))),  # --notemp is no -n
    (["results/x.json", "-j", "4"], SnakemakeArgs()),
])
def test_snakemakes_spellings(argv, expected):
    assert parse(argv) == expected
