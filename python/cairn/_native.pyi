"""Type hints of the Rust extension module (see cairn/__init__.py for the package's API)."""

from os import PathLike
from typing import Any, Dict, List, Optional, Union

class CheckpointError(Exception):
    """A checkpoint could not be written or read."""

class Checkpoint:
    def __init__(
        self,
        task: str,
        phase: str,
        iteration: int,
        state: Any,
        *,
        generation: int = 0,
        done: bool = False,
        output: Any = None,
        cost: Optional[float] = None,
        written_at: str = "",
        attempt: int = 1,
    ) -> None: ...
    task: str
    phase: str
    iteration: int
    state: Any
    generation: int
    done: bool
    output: Any
    cost: Optional[float]
    written_at: str
    attempt: int

class Generation:
    generation: int
    file: str
    bytes: int
    iteration: Optional[int]
    written_at: Optional[str]
    error: Optional[str]

class CheckpointStore:
    def __init__(
        self, path: Union[str, "PathLike[str]"], *, keep_generations: int = 3
    ) -> None: ...
    @property
    def path(self) -> str: ...
    def save(
        self,
        task: str,
        state: Any,
        iteration: int,
        *,
        phase: str = "main",
        done: bool = False,
        output: Any = None,
        cost: Optional[float] = None,
    ) -> int: ...
    def latest(self, task: str) -> Optional[Checkpoint]: ...
    def history(self, task: str) -> List[Generation]: ...
    def generation(self, task: str, generation: int) -> Checkpoint: ...
    def delete(self, task: str) -> None: ...
    def tasks(self, prefix: Optional[str] = None) -> List[str]: ...
    def assume_no_older_files(self, tasks: List[str]) -> None: ...
    def fork(
        self,
        task: str,
        gen: Optional[int] = None,
        patch: Any = None,
        as_id: Optional[str] = None,
    ) -> str: ...

class LoopCheckpointer:
    def __init__(
        self, store: CheckpointStore, task: str, phase: str = "main", every: int = 1
    ) -> None: ...
    def resume(self) -> Optional[Checkpoint]: ...
    def checkpoint(self, iteration: int, state: Any) -> bool: ...
    def finish(self, iteration: int, state: Any, output: Any = None) -> None: ...
    def flush(self) -> None: ...
    @property
    def committed(self) -> Optional[int]: ...

def run_cli(argv: List[str]) -> int: ...
def worker_helper_source() -> str: ...
def dumps(value: Any) -> str: ...
def loads(text: str) -> Any: ...

class QueueError(Exception):
    """A request to a queue failed (the message says which file, task or database, and why)."""

class UsageError(QueueError):
    """A request wrong in itself: a bad task id, a bad patch, an id already taken."""

class InvalidTask(QueueError):
    """A task definition that does not validate, or whose id the queue has already."""

class QueueUnsafe(QueueError):
    """A queue others could write, or that exposes task definitions with `env`."""

class TaskFailed(QueueError):
    """The task ended without finishing."""
    task_id: str
    status: str
    record: Dict[str, Any]

class TaskCancelled(TaskFailed):
    """The task was cancelled by an operator."""

class BudgetExceeded(TaskFailed):
    """The task was stopped by its budget."""

class Queue:
    """A queue directory, or with `db` a queue shared in PostgreSQL."""
    def __init__(
        self, path: Union[str, "PathLike[str]", None] = None, *, db: Optional[str] = None
    ) -> None: ...
    @property
    def location(self) -> str: ...
    def submit(
        self, task: Union[Dict[str, Any], str, "PathLike[str]"], *, create: bool = False
    ) -> str: ...
    def status(self, id: Optional[str] = None) -> Dict[str, Any]: ...
    def show(self, id: str) -> Dict[str, Any]: ...
    def wait(
        self, id: str, timeout: Optional[float] = None, *, poll: float = 0.2
    ) -> Dict[str, Any]: ...
    def pause(self, id: str, *, wait: bool = True) -> str: ...
    def resume(self, id: str, *, wait: bool = True) -> str: ...
    def cancel(self, id: str, *, wait: bool = True) -> str: ...
    def retry(self, id: str, *, wait: bool = True) -> str: ...
    def set_budget(self, id: str, max_cost: float, *, wait: bool = True) -> str: ...
    def fork(
        self,
        id: str,
        gen: Optional[int] = None,
        patch: Any = None,
        as_id: Optional[str] = None,
        from_phase: Optional[str] = None,
    ) -> str: ...
