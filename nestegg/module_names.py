"""Module names that do not depend on how a program was started.

A function defined in the module Python started (``python mypipe.py``) has the module name
``__main__``, while the same function imported by ``nestegg recover --app mypipe:clutch``
is in ``mypipe``. Names recorded in a run's journal use :func:`stable_module_name`, which
gives the started module the name its file would have when imported: the module name of
``python -m pkg.mod``, or the file's path relative to the current directory or an entry
of ``sys.path`` (``python examples/demo.py`` -> ``examples.demo``).
"""

from __future__ import annotations

import functools
import importlib
import os
import sys
from collections.abc import Iterable
from pathlib import Path
from types import ModuleType
from typing import Any

MAIN = "__main__"
STARTED = (MAIN, "__mp_main__")
"""The names of the started module (``__mp_main__``: in a multiprocessing child)."""


def importable_name(file: str | os.PathLike[str], roots: Iterable[str]) -> str | None:
    """The dotted name the Python file ``file`` is imported as from one of ``roots``.

    Of the roots that hold the file, the highest one gives the name (``examples.demo``
    rather than ``demo`` when both the project and its ``examples`` directory are roots);
    an empty root is the current directory.

    Returns:
        The name, or None if no root holds the file under a path of identifiers.

    Example:
        >>> importable_name("/src/app/examples/demo.py", ["/src/app/examples", "/src/app"])
        'examples.demo'
    """
    path = Path(file).resolve()
    if path.suffix != ".py":
        return None
    best: list[str] = []
    for root in roots:
        try:
            relative = path.relative_to(Path(root or os.curdir).resolve())
        except (ValueError, OSError):
            continue
        parts = [*relative.parent.parts, relative.stem]
        if parts[-1] == "__init__":
            parts.pop()
        if len(parts) > len(best) and all(part.isidentifier() for part in parts):
            best = parts
    return ".".join(best) or None


def main_module_name(main: ModuleType | None, roots: Iterable[str]) -> str:
    """The name the module ``main`` (Python's ``__main__``) has when imported.

    Started with ``python -m pkg.mod``: ``pkg.mod`` (from its ``__spec__``). Started as a
    file: :func:`importable_name` of the file from ``roots``. Otherwise (an interactive
    session, ``python -c``): ``__main__``.
    """
    spec = getattr(main, "__spec__", None)
    name = getattr(spec, "name", None)
    if isinstance(name, str) and name and name != MAIN:
        return name
    file = getattr(main, "__file__", None)
    if isinstance(file, str):
        return importable_name(file, roots) or MAIN
    return MAIN


@functools.cache
def _started_module_name(started: str) -> str:
    """This process's started module as imported from the current directory or
    ``sys.path`` (worked out once: a later ``os.chdir`` does not rename what was recorded)."""
    return main_module_name(sys.modules.get(started), [os.getcwd(), *sys.path])


def stable_module_name(module: str) -> str:
    """``module``, with ``__main__`` replaced by the name its file has when imported."""
    return _started_module_name(module) if module in STARTED else module


def started_module(name: str) -> ModuleType | None:
    """The started module if :func:`stable_module_name` gives it the name ``name`` (so a
    name recorded by this process finds what it named, not a second import of the file)."""
    for started in STARTED:
        module = sys.modules.get(started)
        if module is not None and name not in STARTED and stable_module_name(started) == name:
            return module
    return None


def loaded_module_of(qualified: str) -> str | None:
    """The module that the qualified name ``qualified`` (``module.qualname``) starts with:
    its longest dotted prefix naming a module loaded in this process, None if none does.

    Example:
        >>> loaded_module_of("nestegg.module_names.loaded_module_of")
        'nestegg.module_names'
    """
    parts = qualified.split(".")
    for end in range(len(parts) - 1, 0, -1):
        name = ".".join(parts[:end])
        if name in sys.modules or started_module(name) is not None:
            return name
    return None


def named_object(module: str, qualname: str, *, importing: bool = False) -> Any:
    """What ``qualname`` names in the module recorded as ``module`` (a name
    :func:`stable_module_name` gave: the started module is found by it too), or None.

    Only a module loaded in this process is looked in, unless ``importing`` allows it to
    be imported: a name read from stored data imports nothing by itself.

    Example:
        >>> named_object("nestegg.errors", "JournaledCallError")
        <class 'nestegg.errors.JournaledCallError'>
    """
    try:
        target: Any = started_module(module) or (
            importlib.import_module(module) if importing else sys.modules[module]
        )
        for part in qualname.split("."):
            target = getattr(target, part)
    except (ImportError, AttributeError, KeyError):
        return None
    return target
