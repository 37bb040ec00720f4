"""Operator tooling: what people run against the fleet and its store, torch-free.

The commands (``foreshock detect``, ``warnings``, ``approver``, ``profiles``, ``tune``), tuning
and its score, the store's runs replayed through the detectors, and the profile builder. Why a
room of its own: :mod:`foreshock.detectors` holds the online algorithms a worker runs; these
read the store (:mod:`foreshock.storage`) and the detectors both, and sit above them.
"""
