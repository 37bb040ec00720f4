"""One catalogue: the series the monitors emit, the family each belongs to, the direction a
failure moves it, and the lab's scenarios with the families that should name them.

Every part of foreshock reads these facts from here — the detectors' rules
(:mod:`foreshock.detectors.config`), the dashboard's charts and filters, the storage queries,
the tuner and the benchmarks — so a new series or scenario is added once.

Families (SCIENCE.md):

* ``attention-numerics`` — the ΔW_q, ΔW_k and Δ2 spectral entropies (nats; a coherent low-rank
  bias in the Q/K gradients lowers them) and the largest attention logit max(αQKᵀ) (the FA
  fault's feedback loop itself: biased gradients → growing logits → more bias);
* ``router`` — the routers' token and load entropies (a stable-winner loop lowers them), the
  row-conditioning ratio ε and, with expert capacity, the dropped fraction of assignments;
* ``symptom`` — loss, gradient norm, weight norm: what every trainer already watches, the
  baseline foreshock must beat.

Torch-free and dependency-free.

>>> family_of("attn.dwq.entropy"), family_of("router.epsilon"), family_of("loss")
('attention-numerics', 'router', 'symptom')
>>> family_of("max_logit"), family_of("attn.d2.entropy")   # a per-head series: its module's
('attention-numerics', 'attention-numerics')
>>> scenario("lr-high").right_causes
('optimizer', 'router')
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = [
    "COLLISION",
    "FAMILIES",
    "FAMILY_COLOURS",
    "MECHANISMS",
    "SCENARIOS",
    "SERIES",
    "Scenario",
    "Series",
    "family_of",
    "scenario",
    "scenario_names",
    "series",
]

FAMILIES = ("attention-numerics", "router", "optimizer", "symptom")
# the families that name a cause; ``optimizer`` is the optimizer test (every weight grew past
# its own trend before any mechanism moved), warning only where a profile's rules say so
MECHANISMS = ("attention-numerics", "router", "optimizer")
# not a family of the run's training: another producer writes under its run id
# (foreshock.transport.attempt_guard); its warning's family and role
COLLISION = "collision"
# how a family is drawn wherever it is drawn (dashboard charts, legends): one colour each
FAMILY_COLOURS = {
    "attention-numerics": "#d62728",
    "router": "#9467bd",
    "optimizer": "#ff7f0e",
    "symptom": "#7f7f7f",
    COLLISION: "#17becf",
}


@dataclass(frozen=True)
class Series:
    """A module-level (or global) metric: its family, the way a failure moves it (``up``,
    ``down`` or ``both``), what a person reads, and its per-head form if it has one."""

    metric: str
    family: str
    direction: str
    label: str
    per_head: str | None = None


SERIES: tuple[Series, ...] = (
    Series(
        "attn.d2.entropy_mean",
        "attention-numerics",
        "down",
        "Δ2 spectral entropy (QK increment)",
        per_head="attn.d2.entropy",
    ),
    Series("attn.dwq.entropy", "attention-numerics", "down", "ΔW_q spectral entropy"),
    Series("attn.dwk.entropy", "attention-numerics", "down", "ΔW_k spectral entropy"),
    Series("max_logit", "attention-numerics", "up", "max attention logit"),
    Series("router.token_entropy_norm", "router", "down", "router token entropy (normalised)"),
    Series("router.load_entropy", "router", "down", "expert-load entropy"),
    Series("router.epsilon", "router", "both", "router ε (row conditioning)"),
    Series("loss", "symptom", "up", "loss"),
    Series("grad_norm", "symptom", "up", "grad norm"),
    Series("weight_norm", "symptom", "up", "weight norm"),
    Series("router.dropped_fraction", "router", "up", "dropped fraction (expert capacity)"),
)
_BY_METRIC = {s.metric: s for s in SERIES} | {s.per_head: s for s in SERIES if s.per_head}
_PREFIX_FAMILY = {"attn": "attention-numerics", "router": "router"}


def series(metric: str) -> Series:
    """The catalogue entry of ``metric`` (or of the module metric whose per-head form it is);
    KeyError for a metric the catalogue does not know."""
    return _BY_METRIC[metric]


def family_of(metric: str) -> str:
    """The family of a metric: the catalogue's, else by its first component (``attn.*`` and
    ``router.*`` series the monitors add later), else ``symptom``."""
    if metric in _BY_METRIC:
        return _BY_METRIC[metric].family
    return _PREFIX_FAMILY.get(metric.split(".", 1)[0], "symptom")


@dataclass(frozen=True)
class Scenario:
    """A lab scenario: the families whose warning detects it (``own``; empty: any mechanism
    warning on it is a false one) and the causes its first warning may rightly name."""

    name: str
    own: tuple[str, ...] = ()
    right_causes: tuple[str, ...] = ()

    @property
    def quiet(self) -> bool:
        """Healthy, or a fault too mild or too harmless to warn about (a control)."""
        return not self.own


SCENARIOS: tuple[Scenario, ...] = (
    Scenario("healthy"),
    Scenario("fa-lowprec", ("attention-numerics",), ("attention-numerics",)),
    Scenario("fa-noise"),  # unbiased rounding noise: the control of fa-lowprec
    # a learning-rate ramp collapses the router first of the mechanisms; it is an optimizer fault
    Scenario("lr-high", ("router",), ("optimizer", "router")),
    Scenario("gbs-small", ("router",), ("router",)),  # feeds the stable-winner loop
    Scenario(
        "combined",
        ("attention-numerics", "router"),
        ("attention-numerics", "router", "optimizer"),
    ),
    Scenario("router-collapse", ("router",), ("router",)),
    Scenario("router-mild"),  # the router's learning rate ×2: the control of router-collapse
)
_BY_NAME = {s.name: s for s in SCENARIOS}


def scenario(name: str) -> Scenario:
    """The catalogue entry of a scenario; KeyError for an unknown name."""
    return _BY_NAME[name]


def scenario_names() -> tuple[str, ...]:
    return tuple(_BY_NAME)
