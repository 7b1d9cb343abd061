"""A LangGraph graph run as a cairn `worker` phase: one checkpoint per super-step.

Each step of the `review` node stands for an LLM call (here: a short sleep) that costs 0.01;
the graph loops until it has reviewed `ROUNDS` drafts. Run standalone it checkpoints into
`graph-checkpoints/`; submitted to a cairn queue as a `worker` phase (review-task.json), the
daemon keeps the checkpoints, sums the costs against the task's budget, and resumes the graph
at its next super-step after a pause, a stop or a crash.

    python3 review_graph.py                         # standalone

    cat > task.json <<EOF                           # under the daemon
    {"phases": [{"name": "review", "kind": "worker", "run": ["python3", "review_graph.py"]}],
     "cwd": "$PWD", "budget": {"max_cost": 1.0}}
    EOF
    cairn submit task.json && cairn run --exit-when-idle
"""

import os
import time
from typing import List, TypedDict

from langgraph.graph import END, START, StateGraph

import cairn
from cairn.langgraph import CairnSaver

ROUNDS = int(os.environ.get("REVIEW_ROUNDS", "20"))
STEP_SECONDS = float(os.environ.get("REVIEW_STEP_SECONDS", "0.2"))


class Review(TypedDict):
    round: int
    notes: List[str]


def review(state: Review) -> Review:
    time.sleep(STEP_SECONDS)  # the LLM call
    cairn.worker.cost(0.01)  # what it cost (dropped outside a worker phase)
    note = f"round {state['round']}: draft {state['round'] + 1} reviewed"
    print(note, flush=True)
    return {"round": state["round"] + 1, "notes": state["notes"] + [note]}


builder = StateGraph(Review)
builder.add_node("review", review)
builder.add_edge(START, "review")
builder.add_conditional_edges("review", lambda s: END if s["round"] >= ROUNDS else "review")
graph = builder.compile(checkpointer=CairnSaver("graph-checkpoints"))

config = {"configurable": {"thread_id": "review"}, "recursion_limit": 10 * ROUNDS + 10}
saved = graph.get_state(config)
if saved.values and not saved.next:
    result = saved.values  # finished before a stop: nothing left to run
else:
    # A saved checkpoint with steps left resumes there; otherwise start with the input.
    start = None if saved.next else {"round": 0, "notes": []}
    result = graph.invoke(start, config, durability="sync")
cairn.worker.output({"rounds": result["round"], "last": result["notes"][-1]})
print(f"done after {result['round']} rounds")
