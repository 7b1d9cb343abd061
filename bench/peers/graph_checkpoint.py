"""The LangGraph checkpoint every saver peer puts for one iteration of the workload: the task's
whole state (bench/workload.md) as the checkpoint's one channel value, a new uuid6 id, the
channel's version the iteration's number; so `SqliteSaver`, `PostgresSaver` and `CairnSaver` get
the very same graph checkpoints. Building it is not timed."""
from langgraph.checkpoint.base import empty_checkpoint
from langgraph.checkpoint.base.id import uuid6


def checkpoint_of(value):
    checkpoint = empty_checkpoint()
    checkpoint["id"] = str(uuid6())
    checkpoint["channel_values"] = {"state": value}
    checkpoint["channel_versions"] = {"state": value["iteration"] + 1}
    return checkpoint


def config_of(task_id, parent):
    configurable = {"thread_id": task_id, "checkpoint_ns": ""}
    if parent:
        configurable["checkpoint_id"] = parent
    return {"configurable": configurable}
