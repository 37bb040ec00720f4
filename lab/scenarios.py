"""Scenario names, torch-free so that the CLI can list them without importing torch."""

SCENARIOS = (
    "healthy",
    "fa-lowprec",
    "fa-noise",
    "lr-high",
    "gbs-small",
    "combined",
    "router-collapse",
    "router-mild",
)
