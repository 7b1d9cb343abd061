#!/usr/bin/env python3
"""A long-running `worker` phase: 30 "epochs" of training, checkpointed after each one.

cairn starts this once and it loops by itself, reporting through the helper in
clients/python/cairn_worker.py. Stop the daemon midway (Ctrl-C) and start it again: the worker
gets SIGTERM, finishes its epoch, checkpoints and exits 75; the next run continues from the
next epoch and ends with the same output as an uninterrupted run. It also runs on its own, from
the queue directory's parent:
`PYTHONPATH="$(cairn clients-path)/python" python3 queue/examples/scripts/train_worker.py`
(set CAIRN_DEBUG=1 to see the messages).
"""
import sys
import time

# cairn puts the directory of its helpers on every command's PYTHONPATH.
try:
    import cairn_worker
except ImportError:
    sys.exit('train_worker.py: cannot import cairn_worker; outside cairn, set PYTHONPATH="$(cairn clients-path)/python"')

EPOCHS = 30

loop = cairn_worker.Loop(total=EPOCHS, state={"loss": 2.0, "samples": 0})
if loop.iteration:
    print(f"resuming at epoch {loop.iteration}", file=sys.stderr)
for epoch in loop:
    time.sleep(0.3)  # stands in for an epoch of real training
    # Rounded, so the state survives its JSON round trip through cairn bit for bit.
    loss = round(loop.state["loss"] * 0.9 + 0.01, 6)
    loop.state = {"loss": loss, "samples": loop.state["samples"] + 1000}
    cairn_worker.cost(0.002)  # sent before the loop checkpoints this epoch
    print(f"epoch {epoch}: loss {loss}", file=sys.stderr)

cairn_worker.output({"epochs": EPOCHS, "final_loss": loop.state["loss"], "samples": loop.state["samples"]})
