"""A package's public names imported from their modules when first used (PEP 562): the
one rule of ``nestegg`` and ``nestegg.checkpoint``'s module ``__getattr__``."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any


def imported_name(
    namespace: dict[str, Any], package: str, homes: Mapping[str, str], name: str
) -> Any:
    """``name`` of ``package`` imported from its module (``homes``), and kept in the
    package's ``namespace`` so that the next use finds it without asking again.

    Raises:
        AttributeError: ``package`` has no such name.
    """
    home = homes.get(name)
    if home is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    namespace[name] = value
    return value


__all__ = ["imported_name"]
