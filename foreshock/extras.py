"""The error a module raises when the optional dependency it wraps is not installed.

Why in the ground floor: the framework integrations and the monitors' transformers hooks live
in different rooms, and both must say the same thing — which extra to install, with torch
pinned, since any other torch pulls a multi-GB CUDA build.
"""

from __future__ import annotations

__all__ = ["missing_extra"]


def missing_extra(module: str, package: str, extra: str) -> ImportError:
    """The ImportError a framework module raises when its framework is not installed."""
    return ImportError(
        f"{module} needs {package}, which is not installed. Install the extra: "
        f"pip install 'foreshock[{extra}]' (keep torch==2.13.0: pin it in the same command)"
    )
