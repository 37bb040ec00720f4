"""Batches the store has not fully taken: each table written as soon as it can be.

Why: one damaged table (a torn ``_delta_log`` commit, a prefix that lost its permissions) used
to stop the sink for every table — warnings and dead letters too — because a batch was
written whole or retried whole. A damaged ``steps`` table is no reason to stop storing
warnings. So the sink keeps the batches not yet fully written, oldest first, and each time it
flushes it writes, batch by batch, every table that can be written:

- **per table, in order.** Once a table failed in a batch, its rows of every later batch wait
  too: a table's commits carry increasing batch numbers (the store's application
  transactions), and a later number landing first would make the earlier batch look written.
- **the record chain, in order.** ``steps`` waits for its batch's ``metric_values`` and
  ``run_events`` for its ``steps`` (:data:`~foreshock.storage.store.WRITE_ORDER`'s rule 1:
  a reader that sees a step row sees its values). ``warnings`` and ``dead_letters`` depend
  on nothing.

The sink commits its broker offsets only once nothing is held, so whatever is held is still in
the broker for the next sink if this one stops. :attr:`HeldBatches.values` bounds the wait:
past the sink's limit it stops reading new messages until the store takes what is held.

>>> class Store:  # "steps" is damaged: everything else is written, steps in order later
...     broken = {"steps"}
...     def write_table(self, name, rows, number):
...         if name in self.broken:
...             raise OSError(f"{name}: torn commit")
...         print("wrote", name, number)
>>> held, store = HeldBatches(), Store()
>>> held.add(1, {"metric_values": [1], "steps": [1], "warnings": [1]}, values=1)
>>> held.add(2, {"steps": [2], "run_events": [2]}, values=0)
>>> sorted(held.write(store))
wrote metric_values 1
wrote warnings 1
['run_events', 'steps']
>>> store.broken = set()
>>> held.write(store), len(held)
wrote steps 1
wrote steps 2
wrote run_events 2
({}, 0)
"""

from __future__ import annotations

from typing import Any

from .store import WRITE_ORDER

__all__ = ["AFTER", "HeldBatches"]

AFTER = {"steps": "metric_values", "run_events": "steps"}  # a table waits for this one's rows


class HeldBatches:
    """``(number, {table: rows}, values)`` not yet written, oldest first."""

    def __init__(self) -> None:
        self._batches: list[tuple[int, dict[str, Any], int]] = []

    def __len__(self) -> int:
        return len(self._batches)

    @property
    def values(self) -> int:
        """Metric values held (what bounds the wait)."""
        return sum(values for _, _, values in self._batches)

    def add(self, number: int, tables: dict[str, Any], values: int) -> None:
        self._batches.append((number, dict(tables), values))

    def drop(self) -> int:
        """Forget every held batch (the partitions are someone else's now); how many."""
        dropped, self._batches = len(self._batches), []
        return dropped

    def write(self, store: Any) -> dict[str, BaseException]:
        """Write what can be written (see the module docstring); the tables that could not,
        with the error that stopped each (a table held behind another: that one's)."""
        failed: dict[str, BaseException] = {}
        for number, tables, _ in self._batches:
            for name in [n for n in WRITE_ORDER if n in tables]:
                waits = failed.get(name) or failed.get(AFTER.get(name, ""))
                if waits is not None:
                    failed[name] = waits
                    continue
                try:
                    store.write_table(name, tables[name], number)
                except Exception as exc:  # delta-rs raises its own errors for a failed commit
                    failed[name] = exc
                    continue
                del tables[name]
        self._batches = [batch for batch in self._batches if batch[1]]
        return failed
