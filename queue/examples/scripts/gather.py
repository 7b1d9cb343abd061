#!/usr/bin/env python3
"""A `once` phase: print the phase output as JSON on stdout."""
import json
import sys

request = json.load(sys.stdin)
print(f"gathering for {request['task_id']}", file=sys.stderr)
json.dump({"topics": ["checkpoints", "queues", "signals", "crash safety"]}, sys.stdout)
