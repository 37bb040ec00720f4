"""One writer group per store.

Two sink groups each read every message, and each sink dedups against what *it* has seen:
both write every record (58 seqs gave 116 step rows) — a renamed group at a redeploy, two
compose stacks on one bucket. So a sink whose store another group committed to in the last
``writer_window`` seconds refuses to start (``SecondWriterError``), unless told to
``take_over``.
"""

from __future__ import annotations

import logging
from typing import Any

from foreshock.transport.service import ServiceRefusedError

__all__ = ["SecondWriterError", "refuse_a_second_writer"]

log = logging.getLogger("foreshock.storage.sink")


class SecondWriterError(ServiceRefusedError):
    """Another sink group writes this store."""


def refuse_a_second_writer(
    store: Any, uri: str, group_id: str, window: float, take_over: bool
) -> None:
    """Raise ``SecondWriterError`` when another group committed to ``store`` within
    ``window`` seconds (unless ``take_over``: then say so and go on)."""
    others = {
        group: ago for group, ago in store.recent_writers(window).items() if group != group_id
    }
    if not others or take_over:
        if others:
            log.warning("foreshock sink: taking the store over from %s", sorted(others))
        return
    group, ago = min(others.items(), key=lambda item: item[1])
    raise SecondWriterError(
        f"the store {uri} is written by sink group {group!r} (its last commit "
        f"{ago:.0f} s ago); a second group would store every record twice. Stop it and "
        f"use --group {group}, or, once it is stopped, --take-over (or wait "
        f"{window / 60:.0f} min)"
    )
