#!/usr/bin/env python3
"""A `loop` phase that works through the output of an earlier phase, one topic per iteration,
and says it is done when there is nothing left."""
import json
import sys
import time

request = json.load(sys.stdin)
topics = request["inputs"]["gather"]["topics"]
state = request["state"] or {"notes": {}}
i = request["iteration"]

time.sleep(0.3)
topic = topics[i]
state["notes"][topic] = f"{len(topic)} letters, reviewed in attempt {request['attempt']}"
done = i + 1 >= len(topics)
reply = {"state": state, "done": done}
if done:
    reply["output"] = {"reviewed": len(state["notes"]), "notes": state["notes"]}
json.dump(reply, sys.stdout)
