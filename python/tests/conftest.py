"""Shared helpers of the package's tests: they run the installed package and `cairn` command."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import List

import pytest


def cairn_command() -> str:
    """The `cairn` command this package installed (on the virtual environment's PATH)."""
    found = shutil.which("cairn")
    if found is None:
        pytest.fail("the `cairn` command is not on PATH: is the package installed?")
    return found


def run_cairn(args: List[str], **kwargs) -> subprocess.CompletedProcess:
    """Run the installed `cairn` with `args`, capturing its output as text."""
    return subprocess.run(
        [cairn_command(), *args], capture_output=True, text=True, timeout=600, **kwargs
    )


@pytest.fixture
def queue(tmp_path: Path) -> Path:
    """A fresh directory for a store or a queue."""
    path = tmp_path / "queue"
    path.mkdir(mode=0o750)
    return path
