"""Remediation: what a run does about a warning, inside the trainer.

The policy (:mod:`.policy`: which action answers which cause, the bounds every action keeps),
its decisions (:mod:`.decision`) and the :class:`~.remedy.Remediator` that makes them; the
runner at a loop's step boundaries (:mod:`.runner`) and a framework callback's side of it
(:mod:`.hooks`); the remedies on a live torch model and optimizer (:mod:`.trainer`), the
snapshots and checkpoints a rollback restores (:mod:`.snapshots`, :mod:`.checkpoints`), the
ranks that act together (:mod:`.ranks`) and the gate a person's request passes
(:mod:`.request_gate`).

Why a room of its own: the monitors only read a run; this room changes it. It sits above the
monitors (it acts on the layers and routers they found) and the detectors (a plain loop's
feed runs them), below the framework callbacks that wire it in (``foreshock.integrations``).
"""
