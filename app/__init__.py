"""The application: the ``foreshock`` command (:mod:`.cli`), the demo and its harness (the
pipeline brought up on one machine), and the service groups.

Why a room of its own: it wires every other room together — the top floor, imported by none.
The ground floor (``foreshock/``: the catalogue, tables, logs, memory, telemetry) is imported by
everyone and imports no room.
"""
