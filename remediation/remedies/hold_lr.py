"""``hold-lr``: every learning rate held at ``lr_scale`` × its value when the warning's
evidence began (before the rise, where it was rising into it), never raised again, decaying
with the schedule (:meth:`~foreshock.remediation.trainer.TrainerRemedies.hold_lr`)."""

from foreshock.remediation.remedies import Remedy, ask

REMEDY = Remedy(
    name="hold-lr",
    summary="hold the learning rate at lr_scale x its value before the evidence",
    apply=lambda trainer, d: ask(trainer, "hold_lr", d.scale, d.since),
    scale="lr_scale",
    from_evidence=True,
)
