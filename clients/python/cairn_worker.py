"""Helpers for a cairn `worker` phase: one long-running process that does its own looping.

A complete worker (30 iterations, checkpointed after each, resumable, stops cleanly on SIGTERM):

    import cairn_worker

    loop = cairn_worker.Loop(total=30, state={"sum": 0})
    for i in loop:                                # starts after the last checkpoint
        loop.state = {"sum": loop.state["sum"] + i * i}
        cairn_worker.cost(0.01)                   # what this iteration cost, if anything
    # After each iteration the loop sends {"checkpoint": {"iteration": i + 1, "state": ...}}
    # and progress; on SIGTERM it lets the current iteration finish, then exits 75.
    cairn_worker.output({"sum": loop.state["sum"]})

The protocol (see clients/README.md): cairn starts the worker with `CAIRN_CHANNEL`, the path of
a FIFO to write JSON lines to, and `CAIRN_RESUME`, the path of the last committed checkpoint
(unset on a fresh start). Exit 0 = phase done, 75 = interrupted (resume me later), anything
else = failed attempt. stdout and stderr are only logs.

`checkpoint()` (and so `Loop`) waits until cairn has committed the checkpoint, through the
answer cairn writes to the FIFO `CAIRN_ACK`, so that a crash re-runs at most the iteration in
flight. `checkpoint(..., wait=False)`, `Loop(..., wait=False)` or `CAIRN_CHECKPOINT_WAIT=0` in
the environment send checkpoints without waiting: faster on a slow disk, but a crash may then
re-run every iteration whose checkpoint was still on its way.

Outside cairn (`CAIRN_CHANNEL` unset) every message is dropped, or printed to stderr when
`CAIRN_DEBUG` is set, so the same script also runs standalone. If cairn goes away (the channel
has no reader any more, or the ack pipe no writer), the worker ends with status 75.

Standard library only; Python 3.8+.
"""

import errno
import json
import os
import select
import signal
import sys
import threading

__all__ = [
    "resume_state", "checkpoint", "progress", "cost", "output", "heartbeat", "send", "Loop",
    "CairnError",
]

EXIT_INTERRUPTED = 75  # "resume me later from my last checkpoint"

_lock = threading.Lock()  # one message at a time, whole lines, from any thread
_fd = None  # the channel, opened on first use and kept open
_gone = False  # the channel lost its reader: cairn is gone, drop everything
_ack_lock = threading.Lock()  # one checkpoint waiting for its answer at a time
_ack_fd = None  # the ack pipe, opened on first use and kept open
_ack_buffer = b""  # answers read but not yet taken


class CairnError(Exception):
    """cairn refused a line the worker sent (the message says why)."""


def resume_state():
    """Return `(iteration, state)` of the last committed checkpoint, or `(0, None)` on a fresh start.

    `iteration` is the number of completed iterations, i.e. the index of the next one to run.
    """
    saved = _read_resume()
    return saved if saved is not None else (0, None)


def checkpoint(iteration, state, wait=None):
    """Commit progress: iterations `0 .. iteration - 1` are done and `state` is their result.

    Inside cairn this waits until cairn has handled the checkpoint (written it durably, unless
    the phase's `checkpoint_every` makes this one wait for a later one) and returns the
    committed iteration count, where a restart would resume. With `wait=False`, or with
    `CAIRN_CHECKPOINT_WAIT=0` in the environment when `wait` is None, it only sends the
    checkpoint and returns None; so does it outside cairn, or under a cairn without `CAIRN_ACK`.
    Raises CairnError if cairn refused the line.
    """
    if isinstance(iteration, bool) or not isinstance(iteration, int) or iteration < 0:
        raise ValueError("iteration must be a whole number of at least 0, not %r" % (iteration,))
    message = {"checkpoint": {"iteration": iteration, "state": state}}
    if not _waits(wait):
        send(message)
        return None
    message["ack"] = True
    with _ack_lock:
        _drain_acks()  # answers nobody waited for must not be taken for this one
        send(message)
        if _gone:
            return None
        return _await_ack(iteration)


def progress(done, total):
    """Report `done` of `total` units of work (for display only)."""
    send({"progress": {"done": done, "total": total}})


def cost(amount):
    """Report the cost of the work since the last cost message; cairn sums them per task."""
    send({"cost": amount})


def output(obj):
    """Set the phase's output (any JSON value); the last one sent before exit wins."""
    send({"output": obj})


def heartbeat():
    """Say "still alive" during long iterations (for the phase's `heartbeat_timeout`)."""
    send({"heartbeat": True})


def send(message):
    """Write one message (a JSON-serialisable dict) to the channel as a single line."""
    line = _dumps(message) + "\n"
    path = os.environ.get("CAIRN_CHANNEL")
    if not path:
        if os.environ.get("CAIRN_DEBUG"):
            sys.stderr.write("cairn: " + line)
        return
    data = line.encode("utf-8")
    global _fd, _gone
    with _lock:
        if _gone:
            return
        try:
            if _fd is None:
                _fd = _open_channel(path)
            while data:  # one write; more only if a signal cut a long line short
                data = data[os.write(_fd, data):]
        except OSError as err:
            # EPIPE: cairn closed the channel; ENXIO: nobody has the FIFO open for reading.
            if err.errno not in (errno.EPIPE, errno.ENXIO):
                raise
            _gone = True
            _daemon_gone(err.strerror)


class Loop:
    """Iterate `range(start, total)`, checkpointing `self.state` after every iteration.

    `start` and the initial state come from `CAIRN_RESUME` when resuming, else 0 and `state`.
    The body reads and sets `loop.state` (any JSON value); once the body has finished iteration
    `i` and the loop moves on, the loop sends the checkpoint `{"iteration": i + 1, "state":
    loop.state}` and `progress(i + 1, total)`.

    SIGTERM (what cairn sends on stop) does not interrupt the body: the current iteration
    finishes, its checkpoint is sent, and the loop exits the process with status 75. If that
    was the last iteration, the loop simply ends, so the worker can send its output and exit 0.
    `loop.stopping` tells whether SIGTERM arrived, for bodies that want to cut an iteration
    short (then `sys.exit(75)` without touching `loop.state`: the iteration is redone later).

    `total=None` loops until the body calls `loop.finish()`, which makes the current iteration
    the last. (A plain `break` leaves without checkpointing the iteration it breaks out of.)
    `wait` is passed to `checkpoint()`: by default the next iteration starts only once the
    last one's checkpoint is committed.
    Create the loop in the main thread: it installs the SIGTERM handler.
    """

    def __init__(self, total=None, state=None, wait=None):
        saved = _read_resume()
        self.iteration, self.state = saved if saved is not None else (0, state)
        self.total = total
        self.wait = wait
        self.stopping = False
        self._last = False
        signal.signal(signal.SIGTERM, self._on_term)

    def finish(self):
        """Make the current iteration the last one."""
        self._last = True

    def _on_term(self, signum, frame):
        self.stopping = True

    def __iter__(self):
        while not self._last and (self.total is None or self.iteration < self.total):
            if self.stopping:
                sys.exit(EXIT_INTERRUPTED)  # nothing new since the last checkpoint
            yield self.iteration
            self.iteration += 1
            checkpoint(self.iteration, self.state, wait=self.wait)
            if self.total is not None:
                progress(self.iteration, self.total)


def _read_resume():
    """`(iteration, state)` from `CAIRN_RESUME`, or None when it is unset."""
    path = os.environ.get("CAIRN_RESUME")
    if not path:
        return None
    with open(path, encoding="utf-8") as f:
        saved = _loads(f.read())
    return saved["iteration"], saved.get("state")


def _dumps(message):
    """A message as one line of JSON. The `cairn` Python package puts its exact encoder here
    (integers of any size and `decimal.Decimal`s with every digit)."""
    return json.dumps(message, separators=(",", ":"), allow_nan=False)


def _loads(text):
    """A checkpoint's JSON read back (the `cairn` package's decoder keeps every digit)."""
    return json.loads(text)


def _open_channel(path):
    # O_NONBLOCK so that opening a FIFO nobody reads fails (ENXIO) instead of hanging forever;
    # writes are blocking again afterwards, so a full pipe waits for cairn to catch up.
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    os.set_blocking(fd, True)
    return fd


def _waits(wait):
    """Whether a checkpoint waits for its answer (only possible inside a cairn with acks)."""
    if not os.environ.get("CAIRN_CHANNEL") or not os.environ.get("CAIRN_ACK"):
        return False
    if wait is None:
        return os.environ.get("CAIRN_CHECKPOINT_WAIT", "1").strip() != "0"
    return bool(wait)


def _ack_pipe():
    global _ack_fd
    if _ack_fd is None:
        # Non-blocking, so that opening never waits and stale answers can be drained; cairn
        # holds a write end for as long as it runs, so end-of-file means cairn is gone.
        flags = os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
        _ack_fd = os.open(os.environ["CAIRN_ACK"], flags)
    return _ack_fd


def _read_ack_chunk(fd):
    """Append what the ack pipe holds to the buffer; False if nothing is there yet."""
    global _ack_buffer
    try:
        chunk = os.read(fd, 65536)
    except BlockingIOError:
        return False
    if not chunk:
        _daemon_gone("no answer: cairn is gone")
    _ack_buffer += chunk
    return True


def _drain_acks():
    global _ack_buffer
    fd = _ack_pipe()
    while _read_ack_chunk(fd):
        pass
    _ack_buffer = b""


def _await_ack(iteration):
    """Wait for cairn's answer to checkpoint `iteration`; return the committed count.

    No time limit: cairn always answers, or stops the worker (SIGTERM, then SIGKILL), or is gone
    (end of file). A signal handler (Loop's SIGTERM) runs and the wait goes on (PEP 475).
    """
    global _ack_buffer
    fd = _ack_pipe()
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    while True:
        while b"\n" not in _ack_buffer:
            poller.poll()
            _read_ack_chunk(fd)
        line, _, _ack_buffer = _ack_buffer.partition(b"\n")
        answer = json.loads(line)
        if "error" in answer:
            raise CairnError("cairn refused a line: %s" % answer["error"])
        if answer.get("checkpoint", -1) >= iteration:
            return answer["committed"]


def _daemon_gone(reason):
    """The channel has no reader: cairn stopped or died. Exit 75 quietly (resume me later)."""
    sys.stderr.write("cairn: channel closed (%s); exiting with status 75\n" % reason)
    if threading.current_thread() is threading.main_thread():
        raise SystemExit(EXIT_INTERRUPTED)
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(EXIT_INTERRUPTED)
