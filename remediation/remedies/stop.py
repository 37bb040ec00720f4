"""``stop``: training stops at the next step boundary (the framework's own stop), the last
checkpoint kept."""

from foreshock.remediation.remedies import Remedy, ask

REMEDY = Remedy(
    name="stop",
    summary="stop training at the next step boundary",
    apply=lambda trainer, d: ask(trainer, "stop"),
)
