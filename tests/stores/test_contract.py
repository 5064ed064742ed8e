"""The store contract suite shipped in :mod:`nestegg.testing`, run against every store the
project registers (tests/registry.py)."""

from nestegg.testing.suite import *  # noqa: F403
