"""The ``cairn`` command, installed by ``pip install``: the same command line as the binary."""

from __future__ import annotations

import sys

from ._native import run_cli


def main() -> None:
    """Run the ``cairn`` command line with this process's arguments and exit with its code."""
    sys.exit(run_cli(["cairn", *sys.argv[1:]]))


if __name__ == "__main__":
    main()
