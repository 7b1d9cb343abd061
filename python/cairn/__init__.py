"""cairn for Python: checkpoint every iteration of an expensive loop, crash-safely.

The store, the loop checkpointer and the ``cairn`` command are cairn's own Rust code: a
checkpoint written here is the file the cairn daemon writes, and ``cairn checkpoint`` and
``cairn history`` read it.

    import cairn

    store = cairn.CheckpointStore("runs")
    loop = cairn.LoopCheckpointer(store, "my-job")
    for i, state in loop.range(100, state={"total": 0}):
        state["total"] += expensive_call(i)
        loop.checkpoint(i + 1, state)

Run it again after a crash and the loop continues after the last completed iteration.
"""

from __future__ import annotations

from typing import Any, Iterator, Optional, Tuple

from ._native import (
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    Generation,
    LoopCheckpointer as _NativeLoopCheckpointer,
)

__all__ = [
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "Generation",
    "LoopCheckpointer",
]


class LoopCheckpointer(_NativeLoopCheckpointer):
    """One loop's checkpoints in a :class:`CheckpointStore`.

    ``resume()`` gives the last committed checkpoint (or ``None``), ``checkpoint(n, state)``
    records that ``n`` iterations are complete (written every ``every`` iterations, durable
    when it returns ``True``), ``finish(n, state, output)`` writes the final one and
    ``flush()`` the one ``every`` held back. :meth:`range` wraps the three.
    """

    def range(self, iterations: int, state: Any = None) -> Iterator[Tuple[int, Any]]:
        """Yield ``(i, state)`` for each iteration still to run, from the one after the last
        committed checkpoint (with its state) up to ``iterations``.

        The body calls ``checkpoint(i + 1, state)`` once iteration ``i`` is complete. When the
        loop ends (or stops with an exception) the iteration held back by ``every`` is
        flushed. A loop that already finished yields nothing.
        """
        resumed: Optional[Checkpoint] = self.resume()
        start = 0
        if resumed is not None:
            if resumed.done:
                return
            start, state = resumed.iteration, resumed.state
        try:
            for i in range(start, iterations):
                yield i, state
        finally:
            self.flush()
