#!/usr/bin/env python3
"""A `once` phase whose output (a JSON array) feeds the `items` phase after it."""
import json
import sys

json.load(sys.stdin)
json.dump([f"page-{n}" for n in range(1, 13)], sys.stdout)
