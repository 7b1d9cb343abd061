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

Run it again after a crash and the loop continues after the last completed iteration. The
same script run by the cairn daemon as a ``worker`` phase checkpoints through the daemon
instead (see :class:`LoopCheckpointer`).
"""

from __future__ import annotations

import os
import signal
import sys
import types
from typing import Any, Iterator, Optional, Tuple, Union

from . import _native
from ._native import (
    BudgetExceeded,
    Checkpoint,
    CheckpointError,
    CheckpointStore,
    Generation,
    InvalidTask,
    Queue,
    QueueError,
    QueueUnsafe,
    TaskCancelled,
    TaskFailed,
    UsageError,
)

__all__ = [
    "BudgetExceeded",
    "Checkpoint",
    "CheckpointError",
    "CheckpointStore",
    "Generation",
    "InvalidTask",
    "LoopCheckpointer",
    "Queue",
    "QueueError",
    "QueueUnsafe",
    "TaskCancelled",
    "TaskFailed",
    "UsageError",
    "in_worker_phase",
    "worker",
]

#: Exit status of a worker that stopped on request and is to be resumed later.
EXIT_INTERRUPTED = 75


def _load_worker_helper() -> types.ModuleType:
    """The worker protocol's helper (``cairn_worker.py``) as shipped in the cairn binary, run
    as the module ``cairn.worker``: one source for queue workers and this package."""
    module = types.ModuleType("cairn.worker")
    module.__file__ = "<cairn_worker.py, shipped with cairn>"
    sys.modules["cairn.worker"] = module
    exec(compile(_native.worker_helper_source(), module.__file__, "exec"), module.__dict__)
    return module


worker = _load_worker_helper()
# The protocol's lines carry numbers exactly, as the store does: integers of any size and
# `Decimal`s with every digit, both ways.
worker._dumps = _native.dumps
worker._loads = _native.loads


def in_worker_phase() -> bool:
    """Whether this process runs as a cairn daemon's ``worker`` phase (``CAIRN_CHANNEL`` set)."""
    return bool(os.environ.get("CAIRN_CHANNEL"))


class LoopCheckpointer:
    """One loop's checkpoints: resume where the last run stopped, checkpoint each iteration.

    Standalone, checkpoints go to ``store`` under ``task`` (written every ``every`` completed
    iterations, durable when :meth:`checkpoint` returns ``True``). Run by the cairn daemon as a
    ``worker`` phase, the same calls go through the daemon's channel instead: :meth:`resume`
    gives what the daemon resumed it from, each checkpoint waits for the daemon's
    acknowledgement (the phase's ``checkpoint_every`` applies, and ``store``, ``task`` and
    ``every`` are not used), :meth:`finish` sets the phase's output, and a SIGTERM from the
    daemon ends :meth:`range` after the iteration in flight with exit status 75.
    """

    def __init__(
        self,
        store: CheckpointStore,
        task: str,
        phase: str = "main",
        every: int = 1,
    ) -> None:
        self._worker = in_worker_phase()
        self._stopping = False
        self._committed: Optional[int] = None
        self._native: Optional[_native.LoopCheckpointer] = None
        if not self._worker:
            self._native = _native.LoopCheckpointer(store, task, phase, every)

    def resume(self) -> Optional[Checkpoint]:
        """The last committed checkpoint of this loop, or ``None`` for a first run."""
        if self._native is not None:
            return self._native.resume()
        if not os.environ.get("CAIRN_RESUME"):
            return None
        iteration, state = worker.resume_state()
        self._committed = iteration
        return Checkpoint(
            os.environ.get("CAIRN_TASK_ID", ""),
            os.environ.get("CAIRN_PHASE", ""),
            iteration,
            state,
            attempt=int(os.environ.get("CAIRN_ATTEMPT", "1")),
        )

    def checkpoint(self, iteration: int, state: Any) -> bool:
        """``iteration`` iterations are complete, leaving ``state``. Returns whether that
        iteration is now committed (durable); a later one may commit it (``every``)."""
        if self._native is not None:
            return self._native.checkpoint(iteration, state)
        committed = worker.checkpoint(iteration, state)
        if committed is not None:
            self._committed = committed
        return committed is not None and committed >= iteration

    def finish(self, iteration: int, state: Any, output: Any = None) -> None:
        """The loop's final checkpoint, marked done, with its ``output`` (in a worker phase:
        the phase's output; ``state`` when ``output`` is ``None``)."""
        if self._native is not None:
            self._native.finish(iteration, state, output)
            return
        self.checkpoint(iteration, state)
        worker.output(state if output is None else output)

    def flush(self) -> None:
        """Write the iteration ``every`` held back, if any (nothing to do in a worker phase)."""
        if self._native is not None:
            self._native.flush()

    @property
    def committed(self) -> Optional[int]:
        """The iteration count of the last committed checkpoint."""
        if self._native is not None:
            return self._native.committed
        return self._committed

    def range(self, iterations: int, state: Any = None) -> Iterator[Tuple[int, Any]]:
        """Yield ``(i, state)`` for each iteration still to run, from the one after the last
        committed checkpoint (with its state) up to ``iterations``.

        The body calls ``checkpoint(i + 1, state)`` once iteration ``i`` is complete. When the
        loop ends (or stops with an exception) the iteration held back by ``every`` is
        flushed. A loop that already finished yields nothing. In a worker phase, a SIGTERM
        lets the iteration in flight finish, then exits with status 75 (resume me).
        """
        resumed = self.resume()
        start = 0
        if resumed is not None:
            if resumed.done:
                return
            start, state = resumed.iteration, resumed.state
        if self._worker:
            signal.signal(signal.SIGTERM, self._on_term)
        try:
            for i in range(start, iterations):
                if self._stopping:
                    sys.exit(EXIT_INTERRUPTED)
                yield i, state
                if self._worker:
                    worker.progress(i + 1, iterations)
        finally:
            self.flush()

    def _on_term(self, signum: int, frame: Union[types.FrameType, None]) -> None:
        self._stopping = True
