"""A model's architecture signature: what a calibrated profile must match to apply (torch-free).

A profile's bands and thresholds describe healthy runs of one model: the same architecture at
another width already leaves them (the lab's Mixtral at hidden 192 against a profile made at
128 warned falsely on 8 of 9 healthy runs). So a profile names the signatures it was
calibrated on, and applies to a run only when the run's signature is one of them; every other
run gets the zero-shot profile (:mod:`foreshock.detectors.profiles`).

The producer writes the signature into its ``start`` record (``monitor.signature``, from the
model's config and what discovery found); the lab's recorded runs, made before it did, have
theirs rebuilt from their model labels.

>>> lab = {"labels": {"arch": "mixtral", "model": {"n_layer": 2, "n_head": 4, "n_kv_head": 2,
...        "n_embd": 128, "n_experts": 8, "top_k": 2, "capacity_factor": 0.0}}}
>>> signature_of(lab)["attention"], signature_of(lab)["hidden"]
('gqa', 128)
>>> same_model(signature_of(lab), {**signature_of(lab), "hidden": 192})
False
>>> describe(signature_of(lab))
'mixtral L2 d128 h4/2 E8k2'
"""

from __future__ import annotations

from typing import Any

__all__ = ["SIGNATURE_FIELDS", "describe", "lab_signature", "same_model", "signature_of"]

# Every field must agree for a profile to apply. ``attention``: "mha", "gqa" or "mla";
# ``experts``/``top_k`` None for a dense model; ``dispatch``: "dropless" or "capacity-<f>".
SIGNATURE_FIELDS = (
    "model_type",
    "layers",
    "hidden",
    "heads",
    "kv_heads",
    "head_dim",
    "experts",
    "top_k",
    "qk_norm",
    "attention",
    "dispatch",
)


def signature_of(start: dict[str, Any] | None) -> dict[str, Any] | None:
    """The signature a run's ``start`` record carries or implies; None when it says nothing.

    The producer's own (``monitor.signature``) first; its model type and dispatch, where the
    producer could not tell them, from the labels (``arch``, ``dispatch``); else the lab's
    model labels (``lab_signature``)."""
    start = start or {}
    labels = start.get("labels") or {}
    sent = (start.get("monitor") or {}).get("signature")
    if isinstance(sent, dict):
        signature = {field: sent.get(field) for field in SIGNATURE_FIELDS}
        if signature["model_type"] is None and labels.get("arch"):
            signature["model_type"] = str(labels["arch"])
        if labels.get("dispatch"):
            signature["dispatch"] = str(labels["dispatch"])
        signature["dispatch"] = signature["dispatch"] or "dropless"
        return signature
    return lab_signature(labels)


def lab_signature(labels: dict[str, Any]) -> dict[str, Any] | None:
    """The signature of a lab run from its labels (``model``: the lab's ``GPTConfig``)."""
    model = labels.get("model")
    if not isinstance(model, dict) or "n_embd" not in model:
        return None
    heads = int(model["n_head"])
    kv_heads = int(model.get("n_kv_head") or heads)
    capacity = float(model.get("capacity_factor") or 0.0)
    experts = model.get("n_experts")
    return {
        "model_type": str(labels.get("arch") or "gpt-moe"),
        "layers": int(model["n_layer"]),
        "hidden": int(model["n_embd"]),
        "heads": heads,
        "kv_heads": kv_heads,
        "head_dim": int(model["n_embd"]) // heads,
        "experts": int(experts) if experts else None,
        "top_k": int(model["top_k"]) if experts else None,
        "qk_norm": bool(model.get("qk_norm", False)),
        "attention": "gqa" if kv_heads < heads else "mha",
        "dispatch": str(labels.get("dispatch") or _dispatch(capacity)),
    }


def _dispatch(capacity_factor: float) -> str:
    return "dropless" if capacity_factor <= 0 else f"capacity-{capacity_factor:g}"


def same_model(a: dict[str, Any] | None, b: dict[str, Any] | None) -> bool:
    """Whether two signatures name one architecture at one size (every field equal)."""
    if a is None or b is None:
        return False
    return all(a.get(field) == b.get(field) for field in SIGNATURE_FIELDS)


def describe(signature: dict[str, Any] | None) -> str:
    """A short label: type, layers, width, heads/kv heads, experts and k, QK-norm, MLA."""
    if signature is None:
        return "no signature"
    s = signature
    text = f"{s.get('model_type') or '?'} L{s.get('layers')} d{s.get('hidden')}"
    text += f" h{s.get('heads')}/{s.get('kv_heads')}"
    if s.get("experts"):
        text += f" E{s['experts']}k{s.get('top_k')}"
    if s.get("qk_norm"):
        text += " qk-norm"
    if s.get("attention") == "mla":
        text += " mla"
    if s.get("dispatch") not in (None, "dropless"):
        text += f" {s['dispatch']}"
    return text
