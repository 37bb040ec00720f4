"""Give freed heap memory back to the OS, so a long-lived service's RSS follows its live data.

CPython frees objects to glibc's ``malloc``, which keeps freed pages in its arenas for reuse.
After a burst — a broker restart re-delivers tens of thousands of messages at once — a
service's RSS would stay at the burst's high-water mark for good. ``malloc_trim(0)`` returns the
whole free pages of every arena to the OS (about a millisecond). Without glibc it does nothing.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import time

__all__ = ["MemoryTrimmer", "trim_free_memory"]


def _libc() -> ctypes.CDLL | None:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") else None
    except OSError:
        return None


_LIBC = _libc()


def trim_free_memory() -> bool:
    """``malloc_trim(0)``; True if glibc gave memory back to the OS.

    >>> isinstance(trim_free_memory(), bool)
    True
    """
    return bool(_LIBC.malloc_trim(0)) if _LIBC is not None else False


class MemoryTrimmer:
    """``maybe_trim()`` trims at most once per ``every`` seconds (call it from a service loop).

    >>> trimmer = MemoryTrimmer(every=3600.0)
    >>> trimmer.maybe_trim(), trimmer.maybe_trim()
    (True, False)
    """

    def __init__(self, every: float = 30.0) -> None:
        self.every = every
        self._last = -float("inf")

    def maybe_trim(self) -> bool:
        """Whether it trimmed now."""
        now = time.monotonic()
        if now - self._last < self.every:
            return False
        self._last = now
        trim_free_memory()
        return True
