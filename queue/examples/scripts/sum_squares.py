#!/usr/bin/env python3
"""One iteration of the `slow-sum` loop: add iteration² to the running total.

cairn sends {"task_id", "phase", "iteration", "state", "inputs", "attempt"} on stdin and reads
{"state": ...} back on stdout. Anything printed on stderr goes to the task's log.
"""
import json
import sys
import time

request = json.load(sys.stdin)
iteration = request["iteration"]
state = request["state"] or {"total": 0, "terms": []}

time.sleep(0.5)  # stands in for an expensive call (an LLM, an API batch, ...)
state["total"] += iteration * iteration
state["terms"].append(iteration)
print(f"iteration {iteration}: total is now {state['total']}", file=sys.stderr)

json.dump({"state": state}, sys.stdout)
