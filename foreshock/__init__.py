"""foreshock: early warning for LLM training runs from mechanism monitors.

The top-level folders of the repository map into this namespace:
``producers/`` is ``foreshock.producers``, ``lab/`` is ``foreshock.lab``, and so on.
"""

__version__ = "0.1.0"
__all__ = ["__version__"]
