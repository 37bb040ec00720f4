"""Shared fault for the store's tests: a Delta commit that lands but reports an error."""

from __future__ import annotations

from typing import Any


def commit_lands_then_fails_once(monkeypatch: Any, error: Exception) -> list[int]:
    """Patch the store's ``write_deltalake``: every commit lands; the second one (``steps``,
    the second table of a batch) then raises ``error`` once, as a lost reply or a disk that
    filled after the log entry was written. Returns the rows of each commit, as they land."""
    import foreshock.storage.store as store_module

    real, calls = store_module.write_deltalake, []

    def lands_then_fails(table: Any, rows: Any, **kw: Any) -> None:
        real(table, rows, **kw)
        calls.append(rows.num_rows)
        if len(calls) == 2:
            raise error

    monkeypatch.setattr(store_module, "write_deltalake", lands_then_fails)
    return calls


def records_batch(run: str, seqs: Any, values: int = 2) -> dict:
    """One batch of ``run``'s records ``seqs`` (step = seq), each with ``values`` values."""
    from foreshock.storage.rows import BatchBuilder

    b = BatchBuilder()
    for seq in seqs:
        b.add_metrics(
            {
                "run_id": run,
                "seq": seq,
                "step": seq,
                "values": {f"v{i}": float(seq) for i in range(values)},
            },
            0.0,
        )
    return b.take()
