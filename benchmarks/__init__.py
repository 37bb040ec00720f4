"""Benchmarks: each runs as ``python -m benchmarks.<name>`` from the repo root (``--quick`` for
a short version), prints a readable table and ends with one JSON object on its last line."""
