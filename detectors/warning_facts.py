"""Two facts every warning carries: its id, and what a user should check for its cause.

Why apart from the engine: the id is a contract with every consumer downstream (the store's
dedup key, the notifier's ledger, Alertmanager's silences, a receiver's own records): the same
warning must get the same id from a replay, a restarted worker or a second one, and a new
warning must never reuse one. The advice is text a person reads, by the cause a warning names.
"""

from __future__ import annotations

import hashlib

__all__ = ["CHECK", "alert_id", "lead_of"]

# What a user should check, by the cause a warning names (or the family of a symptom).
CHECK = {
    "attention-numerics": "attention numerics: a low-precision FlashAttention backward (O in "
    "D = rowsum(dO∘O) rounded to bf16/fp16) and growing attention logits; compute D from an "
    "fp32 O, add QK-norm or logit soft-capping",
    "router": "the router: its learning rate, the load-balancing loss and its weight, the "
    "global batch size, expert capacity",
    "optimizer": "the optimizer: every weight grew beyond healthy runs before any mechanism "
    "moved; check the learning-rate schedule (peak, warm-up), weight decay, batch size",
    "ambiguous": "both mechanism families moved on the same record: check the optimizer's "
    "hyperparameters (learning rate, batch size) first",
    "symptom": "a global symptom (loss, gradient or weight norm): look for the mechanism "
    "warning before it",
}


def alert_id(
    run_id: str,
    family: str,
    module: str | None,
    step: int,
    version: str,
    rank: int | None = None,
    attempt: int | None = None,
) -> str:
    """Deterministic: a restart or a replay re-derives the same id, never a duplicate. Two
    ranks' warnings at one step are two warnings; a run of one process keeps the ids it had
    before ranks were named (``rank`` None). A warning a resumed attempt raises is a new
    warning (``attempt``: the attempt, once the run has resumed), even at a step where the
    abandoned attempt raised one: that one was resolved as superseded, and a receiver told
    of its end must hear of the new one.

    >>> ids = {alert_id("r", "router", "h.0.mlp.gate", 50, "v1", **extra)
    ...        for extra in ({}, {"rank": 1}, {"attempt": 7})}
    >>> len(ids)
    3
    """
    text = f"{run_id}|{family}|{module}|{step}|{version}"
    if rank is not None:
        text += f"|rank {rank}"
    if attempt is not None:
        text += f"|attempt {attempt}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def lead_of(divergence_step: int | None, step: int) -> int | None:
    """Steps from a warning to the divergence; None unless the warning came first (a warning
    after the divergence has no lead, and a step the producer got wrong must not make one).

    >>> lead_of(1178, 1050), lead_of(625, 10**12), lead_of(None, 5)
    (128, None, None)
    """
    if divergence_step is None or step > divergence_step:
        return None
    return divergence_step - step
