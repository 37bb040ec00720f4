"""Placeholder package: arrives in a later issue (see README roadmap)."""
