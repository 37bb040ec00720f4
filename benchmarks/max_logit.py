"""Cost of ``max_logit`` through transformers' attention registry, on and off monitoring steps.

A tiny Mixtral built offline (hidden 128, 4 layers, 4 heads / 2 kv, 8 experts top-2, SDPA),
batch 4 × 128 tokens, one thread. Three arms, interleaved per repetition so machine drift hits
all alike, each timing one forward + backward (the part the wrapper sits in):

* plain — the model as configured (``sdpa``);
* off step — wrapped by ``record_max_logit`` with the monitor disarmed (every step that is not
  a monitoring step: one attribute lookup and a flag per layer call);
* monitoring step — wrapped and armed: one extra float32 Q Kᵀ per layer, masked max.

Figures: median step time per arm and the two overheads relative to plain.

    python -m benchmarks.max_logit            # 60 repetitions
    python -m benchmarks.max_logit --quick    # 15
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import torch

from foreshock.producers import ListSink, Monitor, MonitorConfig

from ._table import emit_json, format_table, median, single_thread

BATCH, TOKENS = 4, 128


def tiny_mixtral() -> torch.nn.Module:
    import transformers

    config = transformers.MixtralConfig(
        hidden_size=128,
        num_attention_heads=4,
        num_key_value_heads=2,
        num_hidden_layers=4,
        intermediate_size=256,
        num_local_experts=8,
        num_experts_per_tok=2,
        vocab_size=256,
        max_position_embeddings=256,
        bos_token_id=0,
        eos_token_id=0,
    )
    torch.manual_seed(0)
    return transformers.MixtralForCausalLM(config)


def timed_step(model: torch.nn.Module, ids: torch.Tensor) -> float:
    start = time.perf_counter()
    model(input_ids=ids, labels=ids).loss.backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def measure(repeats: int) -> dict[str, float]:
    from foreshock.producers.hf_attention import record_max_logit

    plain, wrapped = tiny_mixtral(), tiny_mixtral()
    monitor = Monitor(wrapped, ListSink(), run_id="bench", config=MonitorConfig(every=1000))
    paths = record_max_logit(wrapped, monitor)
    ids = torch.randint(0, 256, (BATCH, TOKENS), generator=torch.Generator().manual_seed(1))
    times: dict[str, list[float]] = {"plain": [], "off": [], "on": []}
    for rep in range(repeats + 2):  # two warm-up repetitions, not kept
        for arm in ("plain", "off", "on")[rep % 3 :] + ("plain", "off", "on")[: rep % 3]:
            monitor._observed.armed = arm == "on"
            elapsed = timed_step(plain if arm == "plain" else wrapped, ids)
            if rep >= 2:
                times[arm].append(elapsed)
    recorded = sorted(k for k in monitor._observed.max_logits)
    monitor.close()
    step = {arm: median(v) for arm, v in times.items()}
    return {
        "layers": len(paths),
        "layers_recorded": len(recorded),
        "step_s_plain": step["plain"],
        "step_s_off": step["off"],
        "step_s_on": step["on"],
        "overhead_off": step["off"] / step["plain"] - 1,
        "overhead_on": step["on"] / step["plain"] - 1,
    }


def figures(result: dict[str, Any]) -> list[tuple[str, str]]:
    """``benchmarks.readme``'s rows for this result: the max_logit wrapper's cost on a
    monitoring step's forward + backward against plain SDPA, and on every other step
    (installed, disarmed)."""
    return [
        (
            f"max_logit via the attention registry, tiny Mixtral ({result['layers']} layers, "
            f"batch {result['batch']} × {result['tokens']}): forward + backward on a monitoring "
            "step",
            f"{result['overhead_on']:+.1%} vs plain SDPA",
        ),
        (
            "… on every other step (wrapper installed, disarmed)",
            f"{result['overhead_off']:+.1%} (noise)",
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    single_thread()
    repeats = 15 if args.quick else 60
    r = measure(repeats)
    print(
        format_table(
            ["arm", "median forward+backward", "vs plain"],
            [
                ["plain (sdpa)", f"{r['step_s_plain'] * 1e3:.1f} ms", "–"],
                [
                    "wrapped, off step",
                    f"{r['step_s_off'] * 1e3:.1f} ms",
                    f"{r['overhead_off']:+.1%}",
                ],
                [
                    "wrapped, monitoring step",
                    f"{r['step_s_on'] * 1e3:.1f} ms",
                    f"{r['overhead_on']:+.1%}",
                ],
            ],
        )
    )
    emit_json(
        {
            "benchmark": "max_logit",
            "quick": args.quick,
            "repeats": repeats,
            "batch": BATCH,
            "tokens": TOKENS,
            **r,
        }
    )


if __name__ == "__main__":
    main()
