"""The monitor's cost on a GPU, beside the anchor's: run it when a GPU is lent; CI never does.

The anchor (llm-internal-medicine) reports its Δ2+Δ3 measurement at 211 ms for 18 layers at
d = 1024 on one GPU, about 1.2–1.8 % of a step at δ = 10. This measures foreshock's Monitor
(``MonitorConfig(every=δ, spectra_worker=False)``: the spectra computed in the step, so the
time inside ``Monitor.step`` is theirs, as the anchor's is; a JSON Lines sink to a temp file) on:

* ``gpt2-124m``: ``transformers.GPT2LMHeadModel(GPT2Config())`` (12 layers, d = 768);
* ``l18-d1024``: the same family at 18 layers, d = 1024, 16 heads (the anchor's size);

each built offline with random weights, trained with fused AdamW under bf16 autocast, its
attention through PyTorch SDPA restricted to the flash backend
(``torch.nn.attention.sdpa_kernel(SDPBackend.FLASH_ATTENTION)``; on CPU: SDPA's default).
Per model, after ``--warmup`` steps of each: the mean step time without a monitor and with
one, timed to ``torch.cuda.synchronize()``, the time inside ``Monitor.step`` on its
monitoring steps, and the overhead

    overhead = (t_monitored − t_bare) / t_bare            (fraction of a step, at δ)

— end to end, over interleaved blocks of δ steps (bare, monitored, bare, …) so drift hits
both alike.

    python -m benchmarks.gpu_check                        # CUDA: both models, δ = 10
    python -m benchmarks.gpu_check --device cpu --quick   # a tiny smoke run anywhere

Output: a table, then one JSON object on the last line —
``{"benchmark": "gpu_check", "device": …, "every": 10, "anchor": {…}, "rows": [{"model",
"layers", "width", "batch", "context", "step_ms", "monitor_ms", "overhead", …}]}``.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F

from foreshock.producers import JsonlSink, Monitor, MonitorConfig

from ._table import emit_json, format_table

ANCHOR = {"what": "Δ2+Δ3, 18 layers, d = 1024, one GPU", "ms": 211, "overhead at δ=10": "1.2–1.8 %"}
MODELS = {  # name -> (layers, width, heads, vocabulary)
    "gpt2-124m": (12, 768, 12, 50257),
    "l18-d1024": (18, 1024, 16, 50257),
}
QUICK = {"tiny-l2-d64": (2, 64, 4, 256)}


def build(layers: int, width: int, heads: int, vocab: int, device: str) -> torch.nn.Module:
    import transformers

    transformers.logging.set_verbosity_error()
    config = transformers.GPT2Config(n_layer=layers, n_embd=width, n_head=heads, vocab_size=vocab)
    config._attn_implementation = "sdpa"
    torch.manual_seed(0)
    return transformers.GPT2LMHeadModel(config).to(device).train()


def attention_backend(device: str) -> contextlib.AbstractContextManager:
    """SDPA's flash kernel on CUDA (what a bf16 GPU run uses); the default elsewhere."""
    if device != "cuda":
        return contextlib.nullcontext()
    from torch.nn.attention import SDPBackend, sdpa_kernel

    return sdpa_kernel([SDPBackend.FLASH_ATTENTION])


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


class Bench:
    """One model's training step, with or without its monitor."""

    def __init__(self, spec: tuple[int, ...], args: argparse.Namespace, workdir: Path):
        self.device, self.every = args.device, args.every
        self.model = build(*spec, args.device)
        self.optimizer = torch.optim.AdamW(
            self.model.parameters(), lr=1e-4, fused=args.device == "cuda"
        )
        shape = (args.batch, args.context)
        self.x = torch.randint(0, self.model.config.vocab_size, shape, device=args.device)
        self.monitor = Monitor(
            self.model,
            JsonlSink(workdir / "gpu-check.jsonl"),
            run_id="gpu-check",
            # in the step: the time measured is the spectra's own, as the anchor's is
            config=MonitorConfig(every=args.every, spectra_worker=False),
        )
        self.monitor_seconds: list[float] = []
        self._monitored_steps = 0

    def step(self, monitored: bool) -> None:
        autocast = torch.autocast(self.device, dtype=torch.bfloat16, enabled=self.device == "cuda")
        with autocast, attention_backend(self.device):
            logits = self.model(input_ids=self.x, use_cache=False).logits
            loss = F.cross_entropy(logits[:, :-1].flatten(0, 1).float(), self.x[:, 1:].flatten())
        loss.backward()
        self.optimizer.step()
        if monitored:
            self._monitored_steps += 1
            _sync(self.device)
            tick = time.perf_counter()
            record = self.monitor.step(self._monitored_steps, loss.detach())
            _sync(self.device)
            if record is not None:
                self.monitor_seconds.append(time.perf_counter() - tick)
        self.optimizer.zero_grad(set_to_none=True)

    def block(self, monitored: bool) -> float:
        """Seconds per step over δ steps."""
        _sync(self.device)
        start = time.perf_counter()
        for _ in range(self.every):
            self.step(monitored)
        _sync(self.device)
        return (time.perf_counter() - start) / self.every


def measure(name: str, spec: tuple[int, ...], args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as workdir:
        bench = Bench(spec, args, Path(workdir))
        for _ in range(args.warmup):
            bench.block(False), bench.block(True)
        bench.monitor_seconds.clear()
        bare, monitored = [], []
        for _ in range(args.blocks):
            bare.append(bench.block(False))
            monitored.append(bench.block(True))
        bench.monitor.close()
    t_bare, t_mon = statistics.median(bare), statistics.median(monitored)
    layers, width = spec[:2]
    return {
        "model": name,
        "layers": layers,
        "width": width,
        "batch": args.batch,
        "context": args.context,
        "step_ms": round(1e3 * t_bare, 2),
        "monitored_step_ms": round(1e3 * t_mon, 2),
        "monitor_ms": round(1e3 * statistics.median(bench.monitor_seconds or [0.0]), 2),
        "overhead": round((t_mon - t_bare) / t_bare, 4),
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    parser.add_argument("--quick", action="store_true", help="a tiny model, a few blocks")
    parser.add_argument("--every", type=int, default=10, help="δ: steps between measurements")
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--context", type=int, default=1024)
    parser.add_argument("--warmup", type=int, default=3, help="blocks of each, untimed")
    parser.add_argument("--blocks", type=int, default=20, help="timed blocks of each")
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        sys.exit("foreshock gpu_check: no CUDA device here (run it where a GPU is lent; "
                 "--device cpu --quick is the smoke run)")  # fmt: skip
    if args.quick:
        args.batch, args.context, args.warmup, args.blocks = 2, 64, 1, 3
    models = QUICK if args.quick else MODELS
    rows = [measure(name, spec, args) for name, spec in models.items()]
    head = list(rows[0])
    print(format_table(head, [[r[h] for h in head] for r in rows]))
    print(f"anchor: {ANCHOR['what']}: {ANCHOR['ms']} ms, {ANCHOR['overhead at δ=10']} at δ = 10")
    device = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    emit_json(
        {"benchmark": "gpu_check", "device": device, "every": args.every, "anchor": ANCHOR,
         "rows": rows}
    )  # fmt: skip


if __name__ == "__main__":
    main()
