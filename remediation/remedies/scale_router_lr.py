"""``scale-router-lr``: the routers' learning rate held at ``router_lr_scale`` × its value at
the warning, under any optimizer and schedule
(:meth:`~foreshock.remediation.trainer.TrainerRemedies.scale_router_lr`)."""

from foreshock.remediation.remedies import Remedy, ask

REMEDY = Remedy(
    name="scale-router-lr",
    summary="hold the routers' learning rate at router_lr_scale x its value",
    apply=lambda trainer, d: ask(trainer, "scale_router_lr", d.scale),
    scale="router_lr_scale",
    holds_risen_lr=True,
)
