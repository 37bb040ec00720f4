"""The fault-injection lab: a small GPT-MoE trained on CPU, its faults, runs and recordings."""
