"""What a rollback costs: the snapshot ring's host memory and the time to take and restore one.

A remedy that rolls back (``rollback = true``, or the loss-triggered baseline) keeps a ring of
in-memory snapshots (:class:`foreshock.remediation.snapshots.SnapshotRing`): each one a copy of
the model's and the optimizer's state. Per model: its parameters, the bytes one snapshot holds
(AdamW: parameters + two moments ≈ 3× the parameters' bytes), the ring's bytes at capacity,
and the median wall time of taking one and of restoring one (ms) — paid once every ``every``
steps, and once per rollback. Models: the lab's GPT-MoE (what the remediation table trains)
and transformers models built from their configs at a few sizes.

    python -m benchmarks.snapshot_cost --quick     # fewer repeats (~1 min on 2 cores)
    python -m benchmarks.snapshot_cost
"""

from __future__ import annotations

import argparse
import statistics
import time
from typing import Any

import torch

from foreshock.lab.arch import build, default_model
from foreshock.remediation.snapshots import SnapshotRing

from ._table import emit_json, format_table, single_thread

CAPACITY, EVERY = 4, 100  # the loss-triggered baseline's ring (lab.remedies)


def lab_model() -> torch.nn.Module:
    return build("gpt-moe", default_model("gpt-moe")).model


def hf_model(kind: str, hidden: int, layers: int) -> torch.nn.Module:
    """A transformers model built offline from its config class (random weights)."""
    import transformers

    if kind == "mixtral":
        config = transformers.MixtralConfig(
            vocab_size=256,
            hidden_size=hidden,
            intermediate_size=2 * hidden,
            num_hidden_layers=layers,
            num_attention_heads=8,
            num_key_value_heads=2,
            num_local_experts=8,
            num_experts_per_tok=2,
        )
        return transformers.MixtralForCausalLM(config)
    config = transformers.LlamaConfig(
        vocab_size=32000,
        hidden_size=hidden,
        intermediate_size=4 * hidden,
        num_hidden_layers=layers,
        num_attention_heads=8,
        num_key_value_heads=8,
    )
    return transformers.LlamaForCausalLM(config)


def measure(name: str, model: torch.nn.Module, repeats: int) -> dict[str, Any]:
    """Bytes and milliseconds of one snapshot of ``model`` with an AdamW that has stepped."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.zeros_like(p)
    optimizer.step()  # the moments exist, as in training
    ring = SnapshotRing(CAPACITY, EVERY)
    takes, restores = [], []
    for i in range(repeats):
        tick = time.perf_counter()
        ring.maybe_take(i * EVERY, model, optimizer)
        takes.append(time.perf_counter() - tick)
        tick = time.perf_counter()
        ring.restore_before(i * EVERY + 1, model, optimizer)
        restores.append(time.perf_counter() - tick)
    one = ring.nbytes / len(ring.steps)
    n_params = sum(p.numel() for p in model.parameters())
    return {
        "model": name,
        "parameters": n_params,
        "snapshot MB": round(one / 1e6, 1),
        f"ring MB ({CAPACITY})": round(CAPACITY * one / 1e6, 1),
        "bytes / parameter": round(one / n_params, 1),
        "take ms (median)": round(1e3 * statistics.median(takes), 1),
        "restore ms (median)": round(1e3 * statistics.median(restores), 1),
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """Per model: one snapshot's memory, the ring's, and the time to take and restore one."""
    ring = f"ring MB ({CAPACITY})"
    return [
        (
            f"{row['model']} ({row['parameters'] / 1e6:.1f} M parameters)",
            f"{row['snapshot MB']} MB a snapshot ({row['bytes / parameter']} B/parameter), "
            f"{row[ring]} MB the ring of {CAPACITY}; take {row['take ms (median)']} ms, "
            f"restore {row['restore ms (median)']} ms",
        )
        for row in result["rows"]
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="5 repeats, two sizes fewer")
    args = parser.parse_args()
    single_thread()
    torch.manual_seed(0)
    repeats = 5 if args.quick else 15
    models = [("lab GPT-MoE", lab_model), ("Mixtral h256 L4", lambda: hf_model("mixtral", 256, 4))]
    if not args.quick:
        models.append(("Llama h1024 L8", lambda: hf_model("llama", 1024, 8)))
    rows = [measure(name, make(), repeats) for name, make in models]
    headers = list(rows[0])
    print(format_table(headers, [[row[h] for h in headers] for row in rows]))
    emit_json({"benchmark": "snapshot_cost", "rows": rows})


if __name__ == "__main__":
    main()
