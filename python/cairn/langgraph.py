"""A LangGraph checkpoint saver on cairn's checkpoint store.

    from cairn.langgraph import CairnSaver

    saver = CairnSaver("graph-checkpoints")          # a directory of its own
    graph = builder.compile(checkpointer=saver)
    graph.invoke(inputs, {"configurable": {"thread_id": "run-1"}})

Every ``put`` and ``put_writes`` is durable when it returns: each is one save of cairn's store
(a gzip JSON file made durable through the directory's commit log, as the daemon's checkpoints
are). ``keep`` bounds how many checkpoints each thread and namespace keeps (all, by default).

Run by the cairn daemon as a ``worker`` phase (``CAIRN_CHANNEL`` set), the same saver sends each
checkpoint to the daemon instead, and waits until the daemon has committed it: the graph then
gets the daemon's budget, pause, cancel, retry and crash resume, one super-step per iteration.
It keeps only the latest checkpoint of each thread and namespace there, and the daemon resumes
the graph from them (``CAIRN_RESUME``). A SIGTERM from the daemon lets the super-step in flight
finish; once its checkpoint is committed the process exits with status 75 (resume me).

How it is kept: each checkpoint is one entry of the store, named from its thread, namespace and
checkpoint id (``lgc-…``), holding the checkpoint, its metadata, its parent and the values of
the channels it has; the writes pending on a checkpoint are a second entry (``lgw-…``). Values
are stored as LangGraph's serializer makes them (``dumps_typed``), so any value LangGraph can
serialize round-trips. ``cairn --queue DIR checkpoint lgc-…`` decodes an entry.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import os
import re
import signal
import sys
import threading
from collections.abc import AsyncIterator, Iterator, Sequence
from typing import Any, Dict, List, Optional, Tuple, Union

from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    SerializerProtocol,
    get_checkpoint_id,
    get_checkpoint_metadata,
    writes_sort_key,
)

from . import EXIT_INTERRUPTED, CheckpointStore, in_worker_phase, worker

__all__ = ["CairnSaver"]

_CHECKPOINT = "lgc"
_WRITES = "lgw"
# A checkpoint id used as it is in an entry's name (LangGraph's are UUIDs); others are hashed
# into a name with a dot, which a plain id never has.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_-]{1,64}\Z")


def _digest(text: str, length: int) -> str:
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:length]


def _thread_part(thread_id: str) -> str:
    return _digest(thread_id, 24)


def _ns_part(checkpoint_ns: str) -> str:
    return _digest(checkpoint_ns, 8)


def _id_part(checkpoint_id: str) -> str:
    if _PLAIN_ID.match(checkpoint_id):
        return checkpoint_id
    return "h." + _digest(checkpoint_id, 40) + "h"


def _entry(kind: str, thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> str:
    return f"{kind}-{_thread_part(thread_id)}-{_ns_part(checkpoint_ns)}-{_id_part(checkpoint_id)}"


def _config(thread_id: str, checkpoint_ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": checkpoint_ns,
            "checkpoint_id": checkpoint_id,
        }
    }


class _Saved:
    """What :class:`_EntriesInMemory` gives back, shaped as the store's ``Checkpoint``."""

    def __init__(self, state: Dict[str, Any]) -> None:
        self.state = state


class _EntriesInMemory:
    """The saver's entries in this process, for a worker phase (the daemon keeps them)."""

    def __init__(self) -> None:
        self.entries: Dict[str, Dict[str, Any]] = {}

    def latest(self, entry: str) -> Optional[_Saved]:
        state = self.entries.get(entry)
        return None if state is None else _Saved(state)

    def save(self, entry: str, state: Dict[str, Any], iteration: int, **_: Any) -> int:
        self.entries[entry] = state
        return 1

    def tasks(self, prefix: Optional[str] = None) -> List[str]:
        return sorted(e for e in self.entries if prefix is None or e.startswith(prefix))

    def assume_no_older_files(self, entries: List[str]) -> None:
        pass

    def delete(self, entry: str) -> None:
        self.entries.pop(entry, None)


class CairnSaver(BaseCheckpointSaver[str]):
    """LangGraph checkpoints in a cairn checkpoint store, durable when ``put`` returns.

    ``path`` is a directory of the saver's own (created if needed); ``keep`` is how many
    checkpoints to keep per thread and namespace (``None``: all). Each ``put`` and
    ``put_writes`` is one durable save; the async methods run them on a thread, with the
    store releasing the GIL while it waits on the disk. In a cairn ``worker`` phase the
    daemon keeps the checkpoints instead (see the module's documentation) and ``path`` is not
    used. Create it in the main thread there: it installs the SIGTERM handler.
    """

    def __init__(
        self,
        path: Union[str, "os.PathLike[str]", None] = None,
        *,
        keep: Optional[int] = None,
        serde: Optional[SerializerProtocol] = None,
    ) -> None:
        super().__init__(serde=serde)
        if keep is not None and keep < 1:
            raise ValueError(f"keep must be at least 1 or None (all), not {keep!r}")
        self.keep = keep
        self._worker = in_worker_phase()
        self._stopping = False
        self._iteration = 0
        self._sending = threading.Lock()
        if self._worker:
            self.keep = 1
            self.store: Any = _EntriesInMemory()
            self._iteration, resumed = worker.resume_state()
            for entry, state in ((resumed or {}).get("langgraph") or {}).items():
                self.store.entries[entry] = state
            signal.signal(signal.SIGTERM, self._on_term)
        else:
            if path is None:
                raise ValueError("CairnSaver needs a directory outside a cairn worker phase")
            # An entry is saved once (a checkpoint) or rewritten whole (its writes): no older
            # generations are worth keeping.
            self.store = CheckpointStore(path, keep_generations=0)

    def _on_term(self, signum: int, frame: Any) -> None:
        self._stopping = True

    def _send_to_daemon(self, metadata: CheckpointMetadata) -> None:
        """Send the latest checkpoint of every thread and namespace as the worker's next
        iteration, wait until the daemon has committed it, and exit 75 if it asked us to stop."""
        with self._sending:
            if metadata.get("source") in ("input", "update", "fork") or metadata.get("step", 1) < 1:
                # Taking the input (steps -1 and 0), a state update or a fork ran no node of
                # the graph: nothing cost anything. (A step whose nodes report no cost is left
                # so: under a budget the daemon stops the task, fail-closed.)
                worker.cost(0)
            self._iteration += 1
            latest = {e: self.store.entries[e] for e in self.store.tasks(f"{_CHECKPOINT}-")}
            worker.checkpoint(self._iteration, {"langgraph": latest})
            if self._stopping:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(EXIT_INTERRUPTED)

    # -- encoding ---------------------------------------------------------------------

    def _dump(self, value: Any) -> List[str]:
        kind, data = self.serde.dumps_typed(value)
        return [kind, base64.b64encode(data).decode("ascii")]

    def _load(self, typed: List[str]) -> Any:
        return self.serde.loads_typed((typed[0], base64.b64decode(typed[1])))

    def _read(self, entry: str) -> Optional[Dict[str, Any]]:
        # The saver's entries are named uniquely and keep no older generations: the store
        # need not look for any (it would list the whole directory for each new entry).
        self.store.assume_no_older_files([entry])
        latest = self.store.latest(entry)
        return None if latest is None else latest.state

    def _write(self, entry: str, state: Dict[str, Any]) -> None:
        self.store.assume_no_older_files([entry])
        self.store.save(entry, state, 1, phase="langgraph")

    # -- reading ----------------------------------------------------------------------

    def _stored(self, prefix: str) -> List[Dict[str, Any]]:
        """Every checkpoint entry whose name starts with ``prefix``."""
        found = []
        for entry in self.store.tasks(prefix):
            state = self._read(entry)
            if state is not None:
                found.append(state)
        return found

    def _latest_id(self, thread_id: str, checkpoint_ns: str) -> Optional[str]:
        prefix = f"{_CHECKPOINT}-{_thread_part(thread_id)}-{_ns_part(checkpoint_ns)}-"
        entries = self.store.tasks(prefix)
        if not entries:
            return None
        names = [entry[len(prefix) :] for entry in entries]
        if not any("." in name for name in names):
            return max(names)  # every id is its entry's name, and names sort as ids do
        states = self._stored(prefix)
        return max((s["checkpoint_id"] for s in states), default=None)

    def _tuple(self, stored: Dict[str, Any], config: Optional[RunnableConfig] = None) -> CheckpointTuple:
        thread_id = stored["thread_id"]
        checkpoint_ns = stored["checkpoint_ns"]
        checkpoint_id = stored["checkpoint_id"]
        checkpoint = self._load(stored["checkpoint"])
        checkpoint["channel_values"] = {
            channel: self._load(value) for channel, value in stored["values"].items()
        }
        writes = self._read(_entry(_WRITES, thread_id, checkpoint_ns, checkpoint_id))
        pending = [
            (task_id, channel, self._load(value))
            for task_id, _idx, channel, value, _path in (writes or {}).get("writes", [])
        ]
        parent = stored.get("parent_checkpoint_id")
        return CheckpointTuple(
            config=config or _config(thread_id, checkpoint_ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=self._load(stored["metadata"]),
            parent_config=_config(thread_id, checkpoint_ns, parent) if parent else None,
            pending_writes=pending,
        )

    def get_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        """The checkpoint ``config`` names (its ``checkpoint_id``), else its thread's latest."""
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = get_checkpoint_id(config)
        asked = config if checkpoint_id else None
        if not checkpoint_id:
            checkpoint_id = self._latest_id(thread_id, checkpoint_ns)
            if checkpoint_id is None:
                return None
        stored = self._read(_entry(_CHECKPOINT, thread_id, checkpoint_ns, checkpoint_id))
        if stored is None or (stored["thread_id"], stored["checkpoint_ns"]) != (
            thread_id,
            checkpoint_ns,
        ):
            return None
        return self._tuple(stored, asked)

    def list(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first: of ``config``'s thread (and namespace, when it names
        one; every thread without ``config``), whose metadata has ``filter``'s values, older
        than ``before``, at most ``limit``."""
        prefix = f"{_CHECKPOINT}-"
        thread_id = checkpoint_ns = wanted_id = None
        if config:
            thread_id = config["configurable"]["thread_id"]
            prefix += _thread_part(thread_id) + "-"
            checkpoint_ns = config["configurable"].get("checkpoint_ns")
            if checkpoint_ns is not None:
                prefix += _ns_part(checkpoint_ns) + "-"
            wanted_id = get_checkpoint_id(config)
        before_id = get_checkpoint_id(before) if before else None
        found = []
        for stored in self._stored(prefix):
            if thread_id is not None and stored["thread_id"] != thread_id:
                continue
            if checkpoint_ns is not None and stored["checkpoint_ns"] != checkpoint_ns:
                continue
            if wanted_id and stored["checkpoint_id"] != wanted_id:
                continue
            if before_id and stored["checkpoint_id"] >= before_id:
                continue
            if filter:
                metadata = self._load(stored["metadata"])
                if not all(metadata.get(key) == value for key, value in filter.items()):
                    continue
            found.append(stored)
        # Newest first within each thread and namespace (the sort is stable).
        found.sort(key=lambda s: s["checkpoint_id"], reverse=True)
        found.sort(key=lambda s: (s["thread_id"], s["checkpoint_ns"]))
        if limit is not None:
            found = found[: max(limit, 0)]
        for stored in found:
            yield self._tuple(stored)

    # -- writing ----------------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Save ``checkpoint`` as the child of the one ``config`` names; durable on return."""
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        parent_id = config["configurable"].get("checkpoint_id")
        body = dict(checkpoint)
        values: Dict[str, Any] = body.pop("channel_values", {}) or {}
        kept = self._values_kept(
            thread_id, checkpoint_ns, parent_id, body.get("channel_versions", {}), values, new_versions
        )
        self._write(
            _entry(_CHECKPOINT, thread_id, checkpoint_ns, checkpoint["id"]),
            {
                "thread_id": thread_id,
                "checkpoint_ns": checkpoint_ns,
                "checkpoint_id": checkpoint["id"],
                "parent_checkpoint_id": parent_id,
                "checkpoint": self._dump(body),
                "metadata": self._dump(get_checkpoint_metadata(config, metadata)),
                "values": kept,
            },
        )
        if self.keep is not None:
            self._keep_latest(thread_id, checkpoint_ns, self.keep)
        if self._worker:
            self._send_to_daemon(metadata)
        return _config(thread_id, checkpoint_ns, checkpoint["id"])

    def _values_kept(
        self,
        thread_id: str,
        checkpoint_ns: str,
        parent_id: Optional[str],
        versions: ChannelVersions,
        values: Dict[str, Any],
        new_versions: ChannelVersions,
    ) -> Dict[str, List[str]]:
        """The serialized value of each channel the checkpoint has a version of: the new value
        where given, else the parent's value at the same version."""
        kept: Dict[str, List[str]] = {}
        inherited: Optional[Dict[str, Any]] = None
        for channel, version in versions.items():
            if channel in values:
                kept[channel] = self._dump(values[channel])
                continue
            if channel in new_versions:
                continue  # a new version without a value: the channel is empty
            if inherited is None:
                parent = (
                    self._read(_entry(_CHECKPOINT, thread_id, checkpoint_ns, parent_id))
                    if parent_id
                    else None
                )
                inherited = parent or {}
            if channel in inherited.get("values", {}):
                parent_versions = self._load(inherited["checkpoint"]).get("channel_versions", {})
                if parent_versions.get(channel) == version:
                    kept[channel] = inherited["values"][channel]
        return kept

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Save writes pending on the checkpoint ``config`` names; durable on return. A write
        of a task already stored at the same index is kept as it was (a retried task)."""
        thread_id = config["configurable"]["thread_id"]
        checkpoint_ns = config["configurable"].get("checkpoint_ns", "")
        checkpoint_id = config["configurable"]["checkpoint_id"]
        entry = _entry(_WRITES, thread_id, checkpoint_ns, checkpoint_id)
        stored = (self._read(entry) or {}).get("writes", [])
        by_key = {(w[0], w[1]): i for i, w in enumerate(stored)}
        for idx, (channel, value) in enumerate(writes):
            idx = WRITES_IDX_MAP.get(channel, idx)
            row = [task_id, idx, channel, self._dump(value), task_path]
            at = by_key.get((task_id, idx))
            if at is None:
                by_key[(task_id, idx)] = len(stored)
                stored.append(row)
            elif idx < 0:
                stored[at] = row  # errors, interrupts and the like: the latest one counts
        stored.sort(key=lambda w: writes_sort_key(w[4], w[0], w[1]))
        self._write(entry, {"writes": stored})

    # -- removing and copying -----------------------------------------------------------

    def _thread_entries(self, thread_id: str) -> List[Dict[str, Any]]:
        return [
            s
            for s in self._stored(f"{_CHECKPOINT}-{_thread_part(thread_id)}-")
            if s["thread_id"] == thread_id
        ]

    def _remove(self, stored: Dict[str, Any]) -> None:
        key = (stored["thread_id"], stored["checkpoint_ns"], stored["checkpoint_id"])
        self.store.delete(_entry(_WRITES, *key))
        self.store.delete(_entry(_CHECKPOINT, *key))

    def _keep_latest(self, thread_id: str, checkpoint_ns: str, keep: int) -> None:
        stored = [s for s in self._thread_entries(thread_id) if s["checkpoint_ns"] == checkpoint_ns]
        stored.sort(key=lambda s: s["checkpoint_id"], reverse=True)
        for old in stored[keep:]:
            self._remove(old)

    def delete_thread(self, thread_id: str) -> None:
        """Remove every checkpoint and pending write of ``thread_id``."""
        for stored in self._thread_entries(thread_id):
            self._remove(stored)

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Remove the checkpoints (and their writes) whose metadata has one of ``run_ids``."""
        wanted = set(run_ids)
        if not wanted:
            return
        for stored in self._stored(f"{_CHECKPOINT}-"):
            if self._load(stored["metadata"]).get("run_id") in wanted:
                self._remove(stored)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint and pending write of one thread to another, ids kept."""
        for stored in self._thread_entries(source_thread_id):
            key = (stored["checkpoint_ns"], stored["checkpoint_id"])
            writes = self._read(_entry(_WRITES, source_thread_id, *key))
            copy = dict(stored, thread_id=target_thread_id)
            self._write(_entry(_CHECKPOINT, target_thread_id, *key), copy)
            if writes is not None:
                self._write(_entry(_WRITES, target_thread_id, *key), writes)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's latest checkpoint of these threads;
        ``"delete"``: remove them all."""
        if strategy not in ("keep_latest", "delete"):
            raise ValueError(f"unknown prune strategy {strategy!r}: keep_latest or delete")
        for thread_id in thread_ids:
            if strategy == "delete":
                self.delete_thread(thread_id)
                continue
            namespaces = {s["checkpoint_ns"] for s in self._thread_entries(thread_id)}
            for checkpoint_ns in namespaces:
                self._keep_latest(thread_id, checkpoint_ns, 1)

    # -- async ------------------------------------------------------------------------

    async def aget_tuple(self, config: RunnableConfig) -> Optional[CheckpointTuple]:
        return await asyncio.to_thread(self.get_tuple, config)

    async def alist(
        self,
        config: Optional[RunnableConfig],
        *,
        filter: Optional[Dict[str, Any]] = None,
        before: Optional[RunnableConfig] = None,
        limit: Optional[int] = None,
    ) -> AsyncIterator[CheckpointTuple]:
        found = await asyncio.to_thread(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        return await asyncio.to_thread(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[Tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        await asyncio.to_thread(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        await asyncio.to_thread(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await asyncio.to_thread(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await asyncio.to_thread(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await asyncio.to_thread(self.prune, thread_ids, strategy=strategy)
