"""Scenario names (the catalogue's), torch-free so that the CLI can list them without torch."""

from foreshock.catalogue import scenario_names

SCENARIOS = scenario_names()
