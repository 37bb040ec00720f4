"""The support matrix: every architecture of ``foreshock.producers.support``, built offline.

For each: every attention layer and router is found (``discovery.skipped`` names only shared
experts); the
discovered factors reproduce the q and k the model itself hands its attention kernel (up to
the per-token scale of an RMS norm); Δ2, Δ3, ΔW_q/ΔW_k entropies, router token entropy, load
entropy, ε and mean cosine equal a dense float64 reference after a real training step; and
``max_logit`` is recorded for every layer. docs/monitoring.md's support table is
``render_table()``.
"""

from __future__ import annotations

import math
import re
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

transformers = pytest.importorskip("transformers")

from _reference import reference_stats  # noqa: E402

from foreshock.producers import (  # noqa: E402
    ListSink,
    Monitor,
    MonitorConfig,
    hf_attention,
)
from foreshock.producers.support import ARCHITECTURES, build, render_table  # noqa: E402

torch.set_num_threads(1)

B, T, ALPHA = 2, 12, 2.0
ROOT = Path(__file__).resolve().parents[1]


def batch(seed: int) -> torch.Tensor:
    return torch.randint(1, 128, (B, T), generator=torch.Generator().manual_seed(seed))


def train_step(model: Any, optimizer: Any, seed: int) -> None:
    ids = batch(seed)
    model(input_ids=ids, labels=ids).loss.backward()
    optimizer.step()


def f64_heads(spec: Any) -> tuple[np.ndarray, np.ndarray]:
    return spec.heads("q").double().numpy(), spec.heads("k").double().numpy()


# ---- the dense float64 references ---------------------------------------------------------
def attention_reference(before: tuple, after: tuple, name: str) -> dict[str, float]:
    """Every monitored attention value of one layer from dense d'×d' products, float64."""
    (q0, k0), (q1, k1) = before, after
    n_heads, d, d_h = q0.shape
    group = n_heads // k0.shape[0]
    dq, dk = q1 - q0, k1 - k0
    out = {}
    for h in range(n_heads):
        g = h // group
        d2 = dq[h] @ k0[g].T + q0[h] @ dk[g].T  # (d', d'), formed densely
        d3 = dq[h] @ dk[g].T
        out[f"attn.d2.entropy@{name}#h{h}"] = reference_stats(
            np.linalg.svd(d2, compute_uv=False), min(d, 2 * d_h), ALPHA
        )["entropy"]
        out[f"attn.d3.entropy@{name}#h{h}"] = reference_stats(
            np.linalg.svd(d3, compute_uv=False), min(d, d_h), ALPHA
        )["entropy"]
    for which, delta in (("dwq", dq), ("dwk", dk)):
        layer = np.concatenate(list(delta), axis=1)  # (d', heads·d_h)
        sigma = np.linalg.svd(layer, compute_uv=False)
        out[f"attn.{which}.entropy@{name}"] = reference_stats(sigma, min(layer.shape), ALPHA)[
            "entropy"
        ]
    return out


def router_reference(spec: Any, seen: dict[str, Any], rows_now: np.ndarray) -> dict[str, float]:
    """Routing entropies from the router's captured inputs and selection, float64."""
    x = seen["x"].reshape(-1, seen["x"].shape[-1])
    if seen["rows"].shape[1] > x.shape[1]:  # a router bias: x̃ = [x, 1]
        x = np.concatenate([x, np.ones((len(x), 1))], axis=1)
    logits = x @ seen["rows"].T  # (tokens, E)
    n = logits.shape[1]
    if spec.scoring == "sigmoid":
        scores = 1.0 / (1.0 + np.exp(-logits))
        p = scores / scores.sum(1, keepdims=True)
    else:
        p = np.exp(logits - logits.max(1, keepdims=True))
        p /= p.sum(1, keepdims=True)
    h = -(p * np.log(np.where(p > 0, p, 1.0))).sum(1) / math.log(n)
    load = np.bincount(seen["selected"].ravel(), minlength=n).astype(np.float64)
    q = load / load.sum()
    q = q[q > 0]
    w_bar = rows_now.mean(0)
    unit = rows_now / np.linalg.norm(rows_now, axis=1, keepdims=True)
    cos = unit @ unit.T
    return {
        f"router.token_entropy_norm@{spec.name}": float(h.mean()),
        f"router.load_entropy@{spec.name}": float(-(q * np.log(q)).sum() / math.log(n)),
        f"router.epsilon@{spec.name}": float(
            np.linalg.norm(rows_now - w_bar, axis=1).max() / np.linalg.norm(w_bar)
        ),
        f"router.cosine_mean@{spec.name}": float(cos[~np.eye(n, dtype=bool)].mean()),
    }


def capture_routers(monitor: Monitor) -> dict[str, dict[str, Any]]:
    seen: dict[str, dict[str, Any]] = {}
    for spec in monitor.discovery.routers:

        def pre(module: Any, args: Any, spec: Any = spec) -> None:
            seen[spec.name] = {
                "x": args[0].detach().double().numpy().copy(),
                "rows": spec.rows().double().numpy().copy(),
            }

        def post(module: Any, args: Any, output: Any, spec: Any = spec) -> None:
            seen[spec.name]["selected"] = output[2].detach().numpy().copy()

        spec.module.register_forward_pre_hook(pre)
        spec.module.register_forward_hook(post)
    return seen


# ---- the matrix ---------------------------------------------------------------------------
@pytest.fixture(params=ARCHITECTURES, ids=lambda a: a.name)
def arch(request: pytest.FixtureRequest) -> Any:
    return request.param


def test_monitors_match_dense_float64(arch: Any) -> None:
    model = build(arch)
    model.train()
    sink = ListSink()
    monitor = Monitor(model, sink, run_id="matrix", config=MonitorConfig(every=1, alpha=ALPHA))
    shared = [s for s in monitor.discovery.skipped if "shared expert" in s]  # said, not routers
    assert [s for s in monitor.discovery.skipped if s not in shared] == []
    n_layers = arch.settings.get("num_hidden_layers", arch.settings.get("n_layer"))
    assert len(monitor.discovery.attention) == n_layers
    expected_routers = 0 if arch.router == "—" else n_layers
    expected_routers -= arch.settings.get("first_k_dense_replace", 0) if expected_routers else 0
    assert len(monitor.discovery.routers) == expected_routers
    hf_attention.record_max_logit(model, monitor)
    seen = capture_routers(monitor)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)

    train_step(model, optimizer, seed=1)
    monitor.step(0)
    before = {a.name: f64_heads(a) for a in monitor.discovery.attention}
    optimizer.zero_grad()
    train_step(model, optimizer, seed=2)
    after = {a.name: f64_heads(a) for a in monitor.discovery.attention}
    monitor.step(1)
    monitor.close()  # writes what waits for the spectra worker
    record = [r for r in sink.records if r.get("step") == 1 and "values" in r][-1]
    assert record is not None and record["flags"] == [], record and record["flags"]
    values = record["values"]

    for spec in monitor.discovery.attention:
        for key, ref in attention_reference(before[spec.name], after[spec.name], spec.name).items():
            assert values[key] == pytest.approx(ref, abs=1e-6), key
        assert math.isfinite(values[f"max_logit@{spec.name}"])
    for spec in monitor.discovery.routers:
        rows_now = spec.rows().double().numpy()
        for key, ref in router_reference(spec, seen[spec.name], rows_now).items():
            tolerance = 1e-6 * max(1.0, abs(ref))
            assert values[key] == pytest.approx(ref, abs=tolerance), key


def test_factors_reproduce_the_models_own_q_and_k(arch: Any, monkeypatch: Any) -> None:
    """At position 0 rotary embeddings are the identity, so the q, k the kernel receives must be
    x̃ W_q^h, x̃ W_k^g up to a positive per-token scale (RMS norms) — for every head."""
    model = build(arch)
    model.eval()
    monitor = Monitor(model, ListSink(), config=MonitorConfig(every=1))
    modules = dict(model.named_modules())
    captured: dict[str, dict[str, torch.Tensor]] = {}
    current: list[str] = []
    for spec in monitor.discovery.attention:

        def pre(module: Any, args: Any, kwargs: Any, name: str = spec.name) -> None:
            hidden = args[0] if args else kwargs["hidden_states"]
            captured[name] = {"x": hidden.detach().double()}
            current[:] = [name]

        modules[spec.name].register_forward_pre_hook(pre, with_kwargs=True)

    def keep(query: torch.Tensor, key: torch.Tensor) -> None:
        captured[current[0]] |= {"q": query.detach().double(), "k": key.detach().double()}

    if hf_attention._uses_registry(modules[monitor.discovery.attention[0].name]):
        original = model.config._attn_implementation

        def probe(module: Any, query: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
            keep(query, key)
            base = sys.modules[type(module).__module__].eager_attention_forward
            return base(module, query, key, *args, **kwargs)

        transformers.AttentionInterface.register("probe", probe)
        model.set_attn_implementation("probe")
    else:
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def probe_sdpa(query: Any, key: Any, *args: Any, **kwargs: Any) -> Any:
            keep(query, key)
            return sdpa(query, key, *args, **kwargs)

        monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", probe_sdpa)
        original = None
    with torch.no_grad():
        model(input_ids=batch(3), position_ids=torch.zeros(B, T, dtype=torch.long))
    if original is not None:
        model.set_attn_implementation(original)
    monitor.close()

    for spec in monitor.discovery.attention:
        got = captured[spec.name]
        x = got["x"]
        if spec.model_dim == x.shape[-1] + 1:
            x = torch.cat([x, x.new_ones(*x.shape[:-1], 1)], dim=-1)
        for which, factors in (("q", spec.heads("q")), ("k", spec.heads("k"))):
            kernel = got[which][..., : spec.head_dim]  # (B, heads seen, T, d_h); MLA: the nope part
            per_factor = kernel.shape[1] // factors.shape[0]
            for j in range(kernel.shape[1]):
                predicted = x @ factors[j // per_factor].double()  # (B, T, d_h)
                cos = torch.nn.functional.cosine_similarity(predicted, kernel[:, j], dim=-1)
                assert float(cos.min()) > 1 - 1e-9, (spec.name, which, j, float(cos.min()))


def test_docs_support_table_is_the_matrix() -> None:
    readme = (ROOT / "docs" / "monitoring.md").read_text()
    section = re.search(r"<!-- support-matrix -->\n(.*?)\n<!-- /support-matrix -->", readme, re.S)
    assert section, "docs/monitoring.md lacks the table: python -m foreshock.producers.support"
    assert section.group(1).strip() == render_table().strip()
