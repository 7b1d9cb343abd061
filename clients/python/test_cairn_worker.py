"""Tests for cairn_worker.py with a real FIFO, real worker processes and a real SIGTERM.

Run from this directory: python3 -m unittest
"""

import json
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import unittest

import cairn_worker

HERE = os.path.dirname(os.path.abspath(__file__))


class Channel:
    """A FIFO read the way cairn reads it: held open for reading from before the worker starts.

    A spare write end is held too, so that a writer closing the FIFO is not an end of file;
    `lines()` drops it once the worker has exited and returns everything that was written.
    """

    def __init__(self, directory):
        self.path = os.path.join(directory, "channel")
        os.mkfifo(self.path)
        self._read_fd = os.open(self.path, os.O_RDONLY | os.O_NONBLOCK)
        os.set_blocking(self._read_fd, True)
        self._spare_fd = os.open(self.path, os.O_WRONLY)
        self._chunks = []
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self):
        while True:
            chunk = os.read(self._read_fd, 65536)
            if not chunk:
                break
            self._chunks.append(chunk)
        os.close(self._read_fd)

    def lines(self):
        os.close(self._spare_fd)
        self._thread.join(10)
        assert not self._thread.is_alive(), "the worker still holds the channel open"
        return b"".join(self._chunks).decode("utf-8").splitlines()


def worker_env(**cairn_vars):
    """This environment without any CAIRN_* variable, plus `cairn_vars`, and the helper importable."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
    env["PYTHONPATH"] = HERE
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    env.update(cairn_vars)
    return env


def start_worker(code, **cairn_vars):
    return subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(code)],
        env=worker_env(**cairn_vars),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def run_worker(code, **cairn_vars):
    """Run a worker to its end; return (exit status, stdout, stderr)."""
    proc = start_worker(code, **cairn_vars)
    try:
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    return proc.returncode, out, err


def checkpoint_line(iteration, state):
    return json.dumps({"checkpoint": {"iteration": iteration, "state": state}}, separators=(",", ":"))


# All a worker says on stderr when cairn has gone away: one line, no traceback.
CHANNEL_CLOSED = r"\Acairn: channel closed \([^\n]+\); exiting with status 75\n\Z"

# The daemon writes CAIRN_RESUME as exactly this: one line, these keys in this order, no spaces.
RESUME_FILE = '{"iteration":2,"state":[0,1]}\n'

# Iterations append their index to the state list and take 0.2 s each.
LOOP_WORKER = """
    import time, cairn_worker
    loop = cairn_worker.Loop(total=%d, state=[])
    for i in loop:
        print("start", i, flush=True)
        time.sleep(%s)
        loop.state = loop.state + [i]
    cairn_worker.output({"count": len(loop.state)})
    print("loop ended", flush=True)
"""


class TempDirTest(unittest.TestCase):
    def setUp(self):
        self._tmp = tempfile.TemporaryDirectory()
        self.dir = self._tmp.name
        self.addCleanup(self._tmp.cleanup)

    def write_resume(self, text):
        path = os.path.join(self.dir, "resume.json")
        with open(path, "w") as f:
            f.write(text)
        return path


class MessagesTest(TempDirTest):
    def test_each_helper_writes_one_exact_line(self):
        channel = Channel(self.dir)
        status, out, err = run_worker(
            """
            import cairn_worker as cw
            cw.checkpoint(7, {"seen": ["a", "b"], "note": "caf\\u00e9\\n"})
            cw.progress(7, 40)
            cw.cost(0.12)
            cw.output({"answer": 42})
            cw.heartbeat()
            cw.checkpoint(8, None)
            """,
            CAIRN_CHANNEL=channel.path,
        )
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(
            channel.lines(),
            [
                '{"checkpoint":{"iteration":7,"state":{"seen":["a","b"],"note":"caf\\u00e9\\n"}}}',
                '{"progress":{"done":7,"total":40}}',
                '{"cost":0.12}',
                '{"output":{"answer":42}}',
                '{"heartbeat":true}',
                '{"checkpoint":{"iteration":8,"state":null}}',
            ],
        )

    def test_lines_from_many_threads_never_mix(self):
        channel = Channel(self.dir)
        status, _, err = run_worker(
            """
            import threading, cairn_worker as cw
            def send(t):
                for n in range(200):
                    cw.output({"thread": t, "n": n, "pad": "x" * 3000})
            threads = [threading.Thread(target=send, args=(t,)) for t in range(4)]
            for t in threads: t.start()
            for t in threads: t.join()
            """,
            CAIRN_CHANNEL=channel.path,
        )
        self.assertEqual((status, err), (0, ""))
        lines = channel.lines()
        self.assertEqual(len(lines), 800)
        messages = [json.loads(line)["output"] for line in lines]
        for t in range(4):
            self.assertEqual([m["n"] for m in messages if m["thread"] == t], list(range(200)))


class ResumeTest(TempDirTest):
    def setUp(self):
        super().setUp()
        saved = os.environ.pop("CAIRN_RESUME", None)
        if saved is not None:
            self.addCleanup(os.environ.__setitem__, "CAIRN_RESUME", saved)
        self.addCleanup(os.environ.pop, "CAIRN_RESUME", None)

    def test_fresh_start(self):
        self.assertEqual(cairn_worker.resume_state(), (0, None))

    def test_daemon_format(self):
        state = {"b": [1, 2.5, None], "a": {"s": "}\"state\":"}}
        text = '{"iteration":7,"state":' + json.dumps(state, separators=(",", ":")) + "}\n"
        os.environ["CAIRN_RESUME"] = self.write_resume(text)
        self.assertEqual(cairn_worker.resume_state(), (7, state))

    def test_unreadable_resume_file_is_an_error_not_a_fresh_start(self):
        os.environ["CAIRN_RESUME"] = os.path.join(self.dir, "missing.json")
        with self.assertRaises(FileNotFoundError):
            cairn_worker.resume_state()


class LoopTest(TempDirTest):
    def test_fresh_run_checkpoints_every_iteration(self):
        channel = Channel(self.dir)
        status, out, err = run_worker(LOOP_WORKER % (3, 0), CAIRN_CHANNEL=channel.path)
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(out, "start 0\nstart 1\nstart 2\nloop ended\n")
        self.assertEqual(
            channel.lines(),
            [
                '{"checkpoint":{"iteration":1,"state":[0]}}',
                '{"progress":{"done":1,"total":3}}',
                '{"checkpoint":{"iteration":2,"state":[0,1]}}',
                '{"progress":{"done":2,"total":3}}',
                '{"checkpoint":{"iteration":3,"state":[0,1,2]}}',
                '{"progress":{"done":3,"total":3}}',
                '{"output":{"count":3}}',
            ],
        )

    def test_resume_continues_after_the_checkpoint(self):
        channel = Channel(self.dir)
        status, out, err = run_worker(
            LOOP_WORKER % (4, 0),
            CAIRN_CHANNEL=channel.path,
            CAIRN_RESUME=self.write_resume(RESUME_FILE),
        )
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(out, "start 2\nstart 3\nloop ended\n")
        self.assertEqual(
            channel.lines(),
            [
                '{"checkpoint":{"iteration":3,"state":[0,1,2]}}',
                '{"progress":{"done":3,"total":4}}',
                '{"checkpoint":{"iteration":4,"state":[0,1,2,3]}}',
                '{"progress":{"done":4,"total":4}}',
                '{"output":{"count":4}}',
            ],
        )

    def test_unbounded_loop_ends_with_finish(self):
        channel = Channel(self.dir)
        status, out, err = run_worker(
            """
            import cairn_worker
            loop = cairn_worker.Loop(state=0)
            for i in loop:
                loop.state += 10
                if i == 1:
                    loop.finish()
            """,
            CAIRN_CHANNEL=channel.path,
        )
        self.assertEqual((status, err), (0, ""))
        self.assertEqual(channel.lines(), [checkpoint_line(1, 10), checkpoint_line(2, 20)])

    def test_sigterm_finishes_the_iteration_checkpoints_and_exits_75(self):
        channel = Channel(self.dir)
        proc = start_worker(LOOP_WORKER % (100, 0.2), CAIRN_CHANNEL=channel.path)
        try:
            seen = b""
            while b"start 2\n" not in seen:  # read below the pipe's buffer, for communicate()
                chunk = os.read(proc.stdout.fileno(), 100)
                self.assertTrue(chunk, "the worker ended early")
                seen += chunk
            proc.send_signal(signal.SIGTERM)  # during iteration 2 (or, on a slow machine, later)
            out, err = proc.communicate(timeout=120)
        finally:
            proc.kill()
        out = seen.decode() + out
        self.assertEqual(proc.returncode, 75, err)
        self.assertEqual(err, "")
        self.assertNotIn("loop ended", out)
        # The iteration running when SIGTERM came was finished and is the last checkpoint.
        last = int(out.splitlines()[-1].split()[1])
        self.assertEqual(out, "".join("start %d\n" % i for i in range(last + 1)))
        expected = []
        for n in range(1, last + 2):
            expected += [checkpoint_line(n, list(range(n))), '{"progress":{"done":%d,"total":100}}' % n]
        self.assertEqual(channel.lines(), expected)


class DaemonGoneTest(TempDirTest):
    def test_channel_without_reader_exits_75_at_once(self):
        path = os.path.join(self.dir, "channel")
        os.mkfifo(path)
        status, out, err = run_worker(
            "import cairn_worker; cairn_worker.heartbeat(); print('not reached')", CAIRN_CHANNEL=path
        )
        self.assertEqual(status, 75)
        self.assertEqual(out, "")
        self.assertRegex(err, CHANNEL_CLOSED)

    def test_reader_closing_mid_run_exits_75_without_traceback(self):
        path = os.path.join(self.dir, "channel")
        os.mkfifo(path)
        read_fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
        proc = start_worker(
            """
            import sys, cairn_worker
            cairn_worker.heartbeat()
            print("sent", flush=True)
            sys.stdin.readline()
            cairn_worker.progress(1, 2)
            print("not reached")
            """,
            CAIRN_CHANNEL=path,
        )
        try:
            self.assertEqual(proc.stdout.readline(), "sent\n")
            self.assertEqual(os.read(read_fd, 100), b'{"heartbeat":true}\n')
            os.close(read_fd)  # cairn goes away
            out, err = proc.communicate("go on\n", timeout=120)
        finally:
            proc.kill()
        self.assertEqual(proc.returncode, 75)
        self.assertEqual(out, "")
        self.assertRegex(err, CHANNEL_CLOSED)


class FakeCairn:
    """A channel and an ack pipe read and written the way cairn does, answering by hand.

    The ack pipe is held open for reading and writing (as cairn holds it), so a worker never
    sees its end until `go_away()`. `next_line()` returns the worker's next channel line.
    """

    def __init__(self, directory):
        self.channel = Channel(directory)
        self.ack_path = os.path.join(directory, "ack")
        os.mkfifo(self.ack_path)
        self._ack_fd = os.open(self.ack_path, os.O_RDWR | os.O_NONBLOCK)
        self._seen = 0

    def env(self):
        return {"CAIRN_CHANNEL": self.channel.path, "CAIRN_ACK": self.ack_path}

    def lines_so_far(self):
        return b"".join(self.channel._chunks).decode("utf-8").split("\n")[:-1]

    def next_line(self, timeout=10):
        deadline = time.monotonic() + timeout
        while True:
            lines = self.lines_so_far()
            if len(lines) > self._seen:
                self._seen += 1
                return lines[self._seen - 1]
            if time.monotonic() > deadline:
                raise AssertionError("no line from the worker within %s s" % timeout)
            time.sleep(0.01)

    def answer(self, line):
        os.write(self._ack_fd, (line + "\n").encode())

    def go_away(self):
        os.close(self._ack_fd)


# Checkpoints 1..3, each followed by what cairn answered ("committed N") or the error.
WAITING_WORKER = """
    import cairn_worker
    for n in (1, 2, 3):
        try:
            print("committed", cairn_worker.checkpoint(n, [n]), flush=True)
        except cairn_worker.CairnError as e:
            print("refused:", e, flush=True)
"""


def ack_line(iteration, state):
    return json.dumps(
        {"checkpoint": {"iteration": iteration, "state": state}, "ack": True}, separators=(",", ":")
    )


class AckTest(TempDirTest):
    def test_checkpoint_waits_for_its_answer_and_returns_the_committed_count(self):
        cairn = FakeCairn(self.dir)
        proc = start_worker(WAITING_WORKER, **cairn.env())
        try:
            self.assertEqual(cairn.next_line(), ack_line(1, [1]))
            time.sleep(0.3)  # unanswered: the worker must not go on
            self.assertEqual(cairn.lines_so_far(), [ack_line(1, [1])])
            cairn.answer('{"checkpoint":1,"committed":1}')
            self.assertEqual(proc.stdout.readline(), "committed 1\n")
            self.assertEqual(cairn.next_line(), ack_line(2, [2]))
            # An older answer (to a checkpoint sent without waiting) is not this one's; with
            # checkpoint_every > 1 the committed count lags behind.
            cairn.answer('{"checkpoint":1,"committed":1}')
            cairn.answer('{"checkpoint":2,"committed":1}')
            self.assertEqual(proc.stdout.readline(), "committed 1\n")
            self.assertEqual(cairn.next_line(), ack_line(3, [3]))
            cairn.answer('{"error":"not a channel message (...)"}')
            out, err = proc.communicate(timeout=10)
        finally:
            proc.kill()
        self.assertEqual((proc.returncode, err), (0, ""))
        self.assertEqual(out, "refused: cairn refused a line: not a channel message (...)\n")

    def test_answers_nobody_waited_for_are_dropped_before_a_checkpoint(self):
        cairn = FakeCairn(self.dir)
        cairn.answer('{"checkpoint":5,"committed":5}')  # stale, from earlier
        cairn.answer('{"error":"stale"}')
        proc = start_worker(WAITING_WORKER, **cairn.env())
        try:
            self.assertEqual(cairn.next_line(), ack_line(1, [1]))
            cairn.answer('{"checkpoint":1,"committed":0}')
            self.assertEqual(proc.stdout.readline(), "committed 0\n")
        finally:
            proc.kill()
            proc.communicate()

    def test_opting_out_sends_without_ack_and_does_not_wait(self):
        # Nobody answers here: a worker that waited would hang and fail the test.
        argument = """
            import cairn_worker as cw
            print(cw.checkpoint(1, "a", wait=False))
            for i in cw.Loop(total=2, wait=False): pass
        """
        environment = """
            import cairn_worker as cw
            print(cw.checkpoint(1, "a"))
            for i in cw.Loop(total=2): pass
        """
        for how, code, env in [
            ("argument", argument, {}),
            ("environment", environment, {"CAIRN_CHECKPOINT_WAIT": "0"}),
        ]:
            with self.subTest(how):
                cairn = FakeCairn(tempfile.mkdtemp(dir=self.dir))
                status, out, err = run_worker(code, **cairn.env(), **env)
                self.assertEqual((status, out, err), (0, "None\n", ""))
                self.assertEqual(
                    cairn.channel.lines(),
                    [
                        checkpoint_line(1, "a"),
                        checkpoint_line(1, None),
                        '{"progress":{"done":1,"total":2}}',
                        checkpoint_line(2, None),
                        '{"progress":{"done":2,"total":2}}',
                    ],
                )

    def test_cairn_gone_while_waiting_exits_75(self):
        cairn = FakeCairn(self.dir)
        proc = start_worker(WAITING_WORKER, **cairn.env())
        try:
            self.assertEqual(cairn.next_line(), ack_line(1, [1]))
            cairn.go_away()
            out, err = proc.communicate(timeout=10)
        finally:
            proc.kill()
        self.assertEqual((proc.returncode, out), (75, ""))
        self.assertRegex(err, CHANNEL_CLOSED)

    def test_sigterm_while_waiting_keeps_waiting_then_the_loop_exits_75(self):
        cairn = FakeCairn(self.dir)
        proc = start_worker(LOOP_WORKER % (100, 0), **cairn.env())
        try:
            self.assertEqual(cairn.next_line(), ack_line(1, [0]))
            proc.send_signal(signal.SIGTERM)
            time.sleep(0.3)  # the handler has run; the worker still waits
            self.assertIsNone(proc.poll())
            cairn.answer('{"checkpoint":1,"committed":1}')
            out, err = proc.communicate(timeout=10)
        finally:
            proc.kill()
        self.assertEqual((proc.returncode, err), (75, ""))
        self.assertEqual(out, "start 0\n")
        self.assertEqual(
            cairn.channel.lines(), [ack_line(1, [0]), '{"progress":{"done":1,"total":100}}']
        )

    def test_a_bad_iteration_is_refused_before_sending(self):
        status, out, err = run_worker(
            "import cairn_worker as cw\ntry:\n    cw.checkpoint(-1, None)\n"
            "except ValueError as e:\n    print(e)\n"
        )
        self.assertEqual((status, out), (0, "iteration must be a whole number of at least 0, not -1\n"))


class StandaloneTest(TempDirTest):
    WORKER = """
        import cairn_worker as cw
        assert cw.resume_state() == (0, None)
        loop = cw.Loop(total=2, state=0)
        for i in loop:
            loop.state += 1
        cw.progress(1, 2); cw.cost(1.5); cw.output([loop.state]); cw.heartbeat()
    """

    def test_without_channel_messages_are_dropped(self):
        self.assertEqual(run_worker(self.WORKER), (0, "", ""))

    def test_with_cairn_debug_messages_go_to_stderr(self):
        status, out, err = run_worker(self.WORKER, CAIRN_DEBUG="1")
        self.assertEqual((status, out), (0, ""))
        self.assertEqual(
            err.splitlines(),
            [
                'cairn: {"checkpoint":{"iteration":1,"state":1}}',
                'cairn: {"progress":{"done":1,"total":2}}',
                'cairn: {"checkpoint":{"iteration":2,"state":2}}',
                'cairn: {"progress":{"done":2,"total":2}}',
                'cairn: {"progress":{"done":1,"total":2}}',
                'cairn: {"cost":1.5}',
                'cairn: {"output":[2]}',
                'cairn: {"heartbeat":true}',
            ],
        )


if __name__ == "__main__":
    unittest.main()
