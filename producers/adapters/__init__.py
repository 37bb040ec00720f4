"""Framework adapters: models whose layouts the generic discovery rules can't read.

Each adapter module has ``find(name, module)``: None when the module is not that framework's,
else the list of what it found there (specs, or strings for ``Discovery.skipped``), possibly
empty — a framework module claimed by its adapter is never also read by the generic rules.
Frameworks are recognised by their classes' module paths, so that none of them is imported
here and foreshock imports without them.
"""

from __future__ import annotations

from . import megatron, olmo_core

__all__ = ["FINDERS"]

FINDERS = (megatron.find, olmo_core.find)
