"""``precise-attention``: the attention backward in full precision — every layer, or the one
the warning names (``attention_scope = "module"``) — through transformers' attention registry
(:meth:`~foreshock.remediation.trainer.TrainerRemedies.precise_attention`)."""

from foreshock.remediation.remedies import Remedy, ask

REMEDY = Remedy(
    name="precise-attention",
    summary="switch the attention to a full-precision implementation",
    apply=lambda trainer, d: ask(trainer, "precise_attention", d.target),
    holds_risen_lr=True,
)
