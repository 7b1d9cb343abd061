"""The `cairn` command `pip install` puts on PATH is the binary's command line."""

from __future__ import annotations

from pathlib import Path

from conftest import run_cairn


def test_help_and_exit_codes_are_the_binarys(queue: Path) -> None:
    helped = run_cairn(["--help"])
    assert helped.returncode == 0
    assert "checkpoint" in helped.stdout and "submit" in helped.stdout

    usage = run_cairn(["no-such-command"])
    assert usage.returncode == 2

    bad = queue.parent / "bad.json"
    bad.write_text('{"phases": []}')
    invalid = run_cairn(["validate", str(bad)])
    assert invalid.returncode == 3
    assert "bad.json" in invalid.stderr and "phases" in invalid.stderr
