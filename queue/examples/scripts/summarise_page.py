#!/usr/bin/env python3
"""One item of an `items` phase: cairn sends {"index", "item", ...}; the reply is the result."""
import json
import sys
import time

request = json.load(sys.stdin)
time.sleep(0.4)  # stands in for one API call
page = request["item"]
print(f"summarising {page} (item {request['index']})", file=sys.stderr)
json.dump({"page": page, "words": len(page) * 100 + request["index"]}, sys.stdout)
