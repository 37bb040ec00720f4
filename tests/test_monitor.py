"""The Monitor on a live (tiny) GPT-MoE training run: schedule, keys, values, robustness.

These pin the in-step contract (``spectra_worker=False``: each monitoring step's record
returned by its own ``step()`` call); the default worker writes the same records a step
later (``tests/test_spectra_worker.py`` holds them equal)."""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import torch
from torch import nn

from foreshock.catalogue import family_of
from foreshock.lab.data import ByteBatches, stdlib_bytes
from foreshock.lab.model import GPT, GPTConfig
from foreshock.producers import JsonlSink, ListSink, Monitor, MonitorConfig
from foreshock.producers.measure import ATTENTION_LAYER_METRICS
from foreshock.producers.sinks import read_jsonl
from foreshock.transport.records import METRICS_SCHEMA, parse_series_key, series_key

torch.set_num_threads(1)

CFG = GPTConfig(block_size=16, n_layer=2, n_head=2, n_embd=32, n_experts=4, top_k=2)
BATCH = 4
ATTN = ("h.0.attn", "h.1.attn")
GATES = ("h.0.mlp.gate", "h.1.mlp.gate")
DATA = stdlib_bytes(max_bytes=200_000)
ROUTER_METRICS = {
    f"router.{m}"
    for m in (
        *("token_entropy", "token_entropy_norm", "token_entropy_norm_p05"),
        *("token_entropy_norm_min", "load_entropy", "load_maxvio"),
        *("cosine_mean", "epsilon", "cosine_floor"),
    )
}


def make_model(seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(CFG)


class Run:
    """A training loop in the order the Monitor documents: backward, step, monitor, zero_grad."""

    def __init__(self, model: nn.Module, monitor: Monitor, seed: int = 0, lr: float = 3e-3):
        self.model, self.monitor = model, monitor
        self.opt = torch.optim.AdamW(model.parameters(), lr=lr)
        self.batches = ByteBatches(DATA, CFG.block_size, BATCH, seed=seed)
        self.losses: dict[int, torch.Tensor] = {}

    def step(
        self, step: int, before_monitor: Callable[[], None] | None = None
    ) -> dict[str, Any] | None:
        x, y = self.batches.next()
        self.model.train()
        _, loss = self.model(x, y)
        loss.backward()
        self.opt.step()
        if before_monitor is not None:
            before_monitor()
        self.losses[step] = loss.detach()
        record = self.monitor.step(step, loss=loss)
        self.opt.zero_grad()
        return record


def norm64(tensors: list[torch.Tensor]) -> float:
    return math.sqrt(sum(t.double().square().sum().item() for t in tensors))


def expected_attention_keys() -> set[str]:
    keys = {series_key(m, name) for m in ATTENTION_LAYER_METRICS for name in ATTN}
    keys |= {
        series_key(f"attn.{inc}.entropy", name, h)
        for inc in ("d2", "d3")
        for name in ATTN
        for h in range(CFG.n_head)
    }
    return keys


def strict_json(line: str) -> Any:
    def refuse(token: str) -> None:
        raise AssertionError(f"non-JSON constant {token} in {line[:80]}")

    return json.loads(line, parse_constant=refuse)


# ---- the normal run -------------------------------------------------------------------------


def test_schedule_keys_and_values() -> None:
    model = make_model()
    sink = ListSink()
    monitor = Monitor(model, sink, run_id="r1", config=MonitorConfig(spectra_worker=False, every=5))
    assert [a.name for a in monitor.discovery.attention] == list(ATTN)
    assert [r.name for r in monitor.discovery.routers] == list(GATES)
    assert all(r.top_k == 2 and r.n_experts == 4 for r in monitor.discovery.routers)

    # Our own record of each step's router logits, gathered independently of the monitor.
    logits: dict[str, torch.Tensor] = {}
    for name in GATES:
        gate = model.get_submodule(name)
        gate.register_forward_hook(
            lambda _m, _i, out, name=name: logits.__setitem__(name, out.detach())
        )

    run = Run(model, monitor)
    expected: dict[int, dict[str, float]] = {}

    def independently(step: int) -> Callable[[], None]:
        def measure() -> None:
            grads = [p.grad for p in model.parameters() if p.grad is not None]
            values = {"grad_norm": norm64(grads), "weight_norm": norm64(list(model.parameters()))}
            for name, z in logits.items():
                logp = torch.log_softmax(z.double(), -1)
                h = -(logp.exp() * logp).sum(-1) / math.log(4)
                load = torch.bincount(z.topk(2, -1).indices.flatten(), minlength=4).double()
                q = load / load.sum()
                values[f"router.token_entropy_norm@{name}"] = h.mean().item()
                values[f"router.token_entropy_norm_min@{name}"] = h.min().item()
                values[f"router.load_entropy@{name}"] = -(
                    q * q.clamp_min(1e-300).log()
                ).sum().item() / math.log(4)
                values[f"router.load_maxvio@{name}"] = (load.max() / load.mean() - 1).item()
            expected[step] = values

        return measure

    returned = {step: run.step(step, independently(step)) for step in range(26)}
    monitor.close()

    steps = [0, 5, 10, 15, 20, 25]
    assert [s for s, r in returned.items() if r is not None] == steps
    assert [r["step"] for r in sink.records] == steps
    assert monitor.records_written == 6 and monitor.errors == 0

    attn_keys = expected_attention_keys()
    for record in sink.records:
        step, values = record["step"], record["values"]
        assert record["schema"] == METRICS_SCHEMA and record["run_id"] == "r1"
        assert (record["rank"], record["world_size"]) == (0, 1)
        assert isinstance(record["time"], float) and record["flags"] == []
        assert all(isinstance(v, float) and math.isfinite(v) for v in values.values())
        for key in values:  # every key parses; modules are real module paths
            parsed = parse_series_key(key)
            if parsed.module is not None:
                model.get_submodule(parsed.module)
        attn = {k for k in values if family_of(parse_series_key(k).metric) == "attention-numerics"}
        # The first monitoring step has no snapshot to difference against yet.
        assert attn == (set() if step == 0 else attn_keys)

        # Symptoms equal values computed independently.
        assert values["loss"] == pytest.approx(run.losses[step].item(), rel=1e-6)
        assert values["grad_norm"] == pytest.approx(expected[step]["grad_norm"], rel=1e-5)
        assert values["weight_norm"] == pytest.approx(expected[step]["weight_norm"], rel=1e-5)

        # Router values: in range, and equal to ours where we computed them.
        for gate in GATES:
            v = {parse_series_key(k).metric: x for k, x in values.items() if k.endswith(gate)}
            assert set(v) == ROUTER_METRICS
            assert 0 <= v["router.token_entropy"] <= math.log(4) + 1e-6
            assert v["router.token_entropy"] == pytest.approx(
                v["router.token_entropy_norm"] * math.log(4), rel=1e-5
            )
            assert 0 <= v["router.token_entropy_norm_min"] <= v["router.token_entropy_norm"] <= 1
            assert 0 <= v["router.token_entropy_norm_p05"] <= 1
            assert 0 <= v["router.load_entropy"] <= 1 + 1e-6
            assert 0 <= v["router.load_maxvio"] <= 4 - 1
            assert -1 / 3 - 1e-6 <= v["router.cosine_mean"] <= 1 + 1e-6
            assert v["router.epsilon"] >= 0
            assert v["router.cosine_floor"] == pytest.approx(
                max(1 - 2 * v["router.epsilon"] ** 2, -1.0), rel=1e-5, abs=1e-6
            )
            for metric in ("token_entropy_norm", "token_entropy_norm_min", "load_entropy"):
                key = f"router.{metric}@{gate}"
                assert values[key] == pytest.approx(expected[step][key], rel=1e-4, abs=1e-6)
            key = f"router.load_maxvio@{gate}"
            assert values[key] == pytest.approx(expected[step][key], rel=1e-5, abs=1e-6)
        for name in ATTN:
            assert 0 <= values.get(f"attn.d2.entropy_min@{name}", 0) <= 1
            for h in range(CFG.n_head):
                assert 0 <= values.get(f"attn.d3.entropy@{name}#h{h}", 0) <= 1


def test_config_switches_drop_keys() -> None:
    model = make_model()
    sink = ListSink()
    config = MonitorConfig(
        spectra_worker=False, every=1, per_head=False, weight_spectra=False, core_method="svd"
    )
    run = Run(model, Monitor(model, sink, config=config))
    for step in range(2):
        run.step(step)
    keys = set(sink.records[1]["values"])
    assert "attn.d2.entropy_mean@h.0.attn" in keys
    assert not any("#h" in k or k.startswith("attn.dw") for k in keys)


def test_inactive_rank_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    model = make_model()
    monitor = Monitor(model, ListSink())
    assert (monitor.rank, monitor.world_size, monitor.active) == (1, 2, False)
    assert not model.h[0].mlp.gate._forward_hooks
    assert Run(model, monitor).step(0) is None and monitor.records_written == 0


# ---- the sink, non-finite values and errors -------------------------------------------------


def test_jsonl_sink_and_nonfinite_weight(tmp_path: Path) -> None:
    model = make_model()
    path = tmp_path / "runs" / "r.jsonl"
    monitor = Monitor(model, JsonlSink(path), config=MonitorConfig(spectra_worker=False, every=3))
    run = Run(model, monitor)

    def poison() -> None:
        with torch.no_grad():
            model.h[0].attn.c_attn.weight[3, 5] = float("nan")

    records = {}
    for step in range(13):  # NaN enters at step 6 and spreads through the model afterwards
        records[step] = run.step(step, poison if step == 6 else None)
    monitor.close()
    assert monitor.errors == 0
    assert [s for s, r in records.items() if r is not None] == [0, 3, 6, 9, 12]

    poisoned = records[6]
    assert poisoned["flags"] == ["nonfinite:weight_norm", "nonfinite@h.0.attn"]
    values = poisoned["values"]
    assert values["weight_norm"] is None and values["grad_norm"] is not None
    layer0 = [v for k, v in values.items() if parse_series_key(k).module == "h.0.attn"]
    layer1 = [v for k, v in values.items() if parse_series_key(k).module == "h.1.attn"]
    assert len(layer0) == len(layer1) > 0
    assert all(v is None for v in layer0) and all(v is not None for v in layer1)
    later = records[9]  # the NaN has reached everything: still a record, flagged throughout
    assert {"nonfinite:loss", "nonfinite@h.1.attn", "nonfinite@h.0.mlp.gate"} <= set(later["flags"])

    text = path.read_text()
    assert "NaN" not in text and "Infinity" not in text
    lines = text.splitlines()
    assert len(lines) == 7  # the run's start and end, which nothing else wrote (run_bounds)
    parsed = [strict_json(line) for line in lines]
    assert parsed == read_jsonl(path)
    assert [r["kind"] for r in (parsed[0], parsed[-1])] == ["start", "end"]
    parsed = parsed[1:-1]
    assert [r["step"] for r in parsed] == [0, 3, 6, 9, 12]
    assert parsed[2]["flags"] == poisoned["flags"]


def test_nonfinite_grad_flagged_and_training_continues() -> None:
    model = make_model()
    sink = ListSink()
    run = Run(model, Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=2)))

    def inf_grad() -> None:
        model.h[1].attn.c_proj.weight.grad[0, 0] = float("inf")

    for step in range(7):
        run.step(step, inf_grad if step == 4 else None)
    by_step = {r["step"]: r for r in sink.records}
    assert by_step[4]["flags"] == ["nonfinite:grad_norm"]
    assert by_step[4]["values"]["grad_norm"] is None
    others = {k: v for k, v in by_step[4]["values"].items() if k != "grad_norm"}
    assert all(v is not None for v in others.values())
    assert by_step[6]["flags"] == [] and by_step[6]["values"]["grad_norm"] is not None
    assert run.monitor.errors == 0


class RaisingSink:
    def __init__(self) -> None:
        self.closed = False

    def write(self, record: dict[str, Any]) -> None:
        raise OSError("disk full")

    def close(self) -> None:
        self.closed = True


def test_raising_sink_never_escapes() -> None:
    model = make_model()
    sink = RaisingSink()
    monitor = Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=2))
    run = Run(model, monitor)
    out = [run.step(step) for step in range(5)]  # would raise here if the error escaped
    assert out == [None] * 5
    assert monitor.errors == 3 and monitor.records_written == 0
    monitor.close()
    assert sink.closed


# ---- router hooks, lifecycle ----------------------------------------------------------------


def test_router_hooks_ignore_eval_and_off_steps() -> None:
    model = make_model()
    sink = ListSink()
    monitor = Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=3))
    calls = dict.fromkeys(GATES, 0)
    for name, acc in monitor._observed.accumulators.items():
        update = acc.update

        def counting(logits: torch.Tensor, selected=None, *, name: str = name, update=update):
            calls[name] += 1
            update(logits, selected)

        acc.update = counting

    run = Run(model, monitor)
    eval_x = torch.zeros(BATCH, CFG.block_size, dtype=torch.long)  # one token everywhere
    seen = []
    for step in range(7):
        model.eval()
        with torch.no_grad():
            model(eval_x)  # evaluation forwards: never counted
        seen.append(dict(calls))
        run.step(step)
    # Only the training forwards of the monitoring steps 0, 3, 6 reached the accumulators.
    assert [c[GATES[0]] for c in seen] == [0, 1, 1, 1, 2, 2, 2]
    assert calls == dict.fromkeys(GATES, 3)

    # An eval forward on a monitoring step leaves that step's routing values untouched.
    eval_then_train, train_only = [], []
    for target, with_eval in ((eval_then_train, True), (train_only, False)):
        model = make_model()
        sink = ListSink()
        run = Run(model, Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=1)))
        if with_eval:
            model.eval()
            model(eval_x)
        run.step(0)
        target.append(sink.records[0]["values"])
    assert eval_then_train == train_only


def test_close_removes_hooks() -> None:
    model = make_model()
    monitor = Monitor(model, ListSink(), config=MonitorConfig(spectra_worker=False, every=1))
    gates = [model.get_submodule(name) for name in GATES]
    assert [len(g._forward_hooks) for g in gates] == [1, 1]
    monitor.close()
    monitor.close()  # safe twice
    assert [len(g._forward_hooks) for g in gates] == [0, 0]
    assert all(acc.empty for acc in monitor._observed.accumulators.values())
    model.train()
    model(torch.zeros(1, 4, dtype=torch.long))
    assert all(acc.empty for acc in monitor._observed.accumulators.values())


def test_bf16_model_copy() -> None:
    model = copy.deepcopy(make_model()).to(torch.bfloat16)
    sink = ListSink()
    monitor = Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=2))
    assert monitor.discovery.attention[0].q_weight.dtype == torch.bfloat16
    run = Run(model, monitor, lr=1e-2)
    for step in range(5):
        run.step(step)
    assert monitor.errors == 0 and [r["step"] for r in sink.records] == [0, 2, 4]
    for record in sink.records[1:]:
        assert record["flags"] == []
        values = record["values"]
        assert expected_attention_keys() <= set(values)
        assert all(v is not None and math.isfinite(v) for v in values.values())
        assert values["attn.dwq.fro@h.0.attn"] > 0


def test_max_logit_through_logit_observer() -> None:
    model = make_model()
    sink = ListSink()
    monitor = Monitor(model, sink, config=MonitorConfig(spectra_worker=False, every=2))
    qkv: dict[str, torch.Tensor] = {}
    for i, block in enumerate(model.h):
        name = f"h.{i}.attn"
        block.attn.logit_observer = lambda s, name=name: monitor.observe_max_logit(name, s)
        block.attn.c_attn.register_forward_hook(
            lambda _m, _i, out, name=name: qkv.__setitem__(name, out.detach())
        )

    def true_max(name: str) -> float:
        q, k, _ = qkv[name].split(CFG.n_embd, dim=-1)
        B, T, _ = q.shape
        q, k = (t.view(B, T, CFG.n_head, -1).transpose(1, 2) for t in (q, k))
        scores = q @ k.transpose(-1, -2) / math.sqrt(CFG.n_embd // CFG.n_head)
        causal = torch.ones(T, T, dtype=torch.bool).tril()
        return scores[..., causal].max().item()  # only the unmasked (j <= i) scores

    run = Run(model, monitor, lr=3e-2)
    expected = {}
    for step in range(5):
        run.step(step, lambda step=step: expected.__setitem__(step, {n: true_max(n) for n in ATTN}))
    assert [r["step"] for r in sink.records] == [0, 2, 4]
    for record in sink.records:
        for name in ATTN:
            got = record["values"][f"max_logit@{name}"]
            assert got == pytest.approx(expected[record["step"]][name], rel=1e-5, abs=1e-7)
    # Between monitoring steps nothing is kept.
    model(torch.zeros(1, 4, dtype=torch.long))
    assert monitor._observed.max_logits == {}
