"""Online detectors: calibrated, attributed early warnings (torch-free)."""
