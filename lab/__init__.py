"""The fault-injection lab: a small GPT-MoE trained on CPU, and (later) its faults."""
