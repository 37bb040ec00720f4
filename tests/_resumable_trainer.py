"""A tiny trainer that checkpoints and resumes, for the run-identity test: ``python
tests/_resumable_trainer.py RUN_ID CHECKPOINT STEPS``. It trains the lab's smallest GPT-MoE
with a Monitor on a KafkaSink (settings from the environment), saves model, optimizer and step
to CHECKPOINT every 10 steps, and on start resumes from CHECKPOINT if there is one — under the
same run id, as a real job restarted by its scheduler; the checkpoint keeps the Monitor's
state too, so the resumed attempt orders after the first whatever the clocks. After each step
it waits until the broker has the step's record and prints ``delivered <step>``, so the test
knows what a SIGKILL can no longer take away. ``CLOCK_OFFSET`` (seconds, in the environment)
sets this process's wall clock off, as a host whose clock is behind."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

if os.environ.get("CLOCK_OFFSET"):  # a host whose clock is off, before anything reads it
    _offset, _time, _time_ns = float(os.environ["CLOCK_OFFSET"]), time.time, time.time_ns
    time.time = lambda: _time() + _offset
    time.time_ns = lambda: _time_ns() + int(_offset * 1e9)

import torch

from foreshock.delivery.kafka_sink import KafkaSink
from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.producers.monitor import Monitor, MonitorConfig


def main(run_id: str, checkpoint: Path, steps: int) -> None:
    torch.set_num_threads(1)
    torch.manual_seed(0)
    config = GPTConfig(block_size=16, n_layer=1, n_head=2, n_embd=32, n_experts=4)
    model = GPT(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    first, state = 0, None
    if checkpoint.exists():
        state = torch.load(checkpoint)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = state["step"] + 1
    batches = ByteBatches(stdlib_bytes(200_000), config.block_size, 4, seed=first)
    sink = KafkaSink()
    # in-step: "delivered <step>" is that step's own record, on the broker before the next step
    config = MonitorConfig(every=1, spectra_worker=False)
    monitor = Monitor(model, sink, run_id=run_id, config=config)
    if state is not None:
        monitor.load_state_dict(state["foreshock"])
    sink.write(
        {
            "schema": "foreshock.run/1",
            "kind": "start",
            "run_id": run_id,
            "labels": {"test": "resume", "resumed_at": first},
        }
    )
    for step in range(first, steps):
        x, y = batches.next()
        _, loss = model(x, y)
        loss.backward()
        optimizer.step()
        monitor.step(step, loss=loss)
        optimizer.zero_grad()
        if step % 10 == 9:
            torch.save(
                {
                    "model": model.state_dict(),
                    "optimizer": optimizer.state_dict(),
                    "step": step,
                    "foreshock": monitor.state_dict(),
                },
                checkpoint,
            )
        sink.wait_delivered(10)
        print(f"delivered {step}", flush=True)
        time.sleep(0.02)
    sink.write({"schema": "foreshock.run/1", "kind": "end", "run_id": run_id, "status": "finished"})
    sink.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), int(sys.argv[3]))
