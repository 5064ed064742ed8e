"""The whole contract suite in one module, for a test module to star-import.

Importing it brings the contract tests, the ``store`` and ``store_factory`` fixtures and
the ``pytest_generate_tests`` hook that runs each test once per registered store.
"""

from __future__ import annotations

import pytest

from nestegg.testing.contract_commits import *  # noqa: F403
from nestegg.testing.contract_forks import *  # noqa: F403
from nestegg.testing.contract_groups import *  # noqa: F403
from nestegg.testing.contract_history import *  # noqa: F403
from nestegg.testing.contract_pages import *  # noqa: F403
from nestegg.testing.contract_runs import *  # noqa: F403
from nestegg.testing.contract_signals import *  # noqa: F403
from nestegg.testing.fixtures import parametrize_stores, store, store_factory, store_name
from nestegg.testing.registry import register_store

pytestmark = [pytest.mark.asyncio]
"""Every contract test is a coroutine: marked, so it runs under pytest-asyncio's strict
mode too."""


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    """Run each contract test once per registered store."""
    parametrize_stores(metafunc)


__all__ = [
    *sorted(name for name in dict(globals()) if name.startswith("test_")),
    "pytest_generate_tests",
    "pytestmark",
    "register_store",
    "store",
    "store_factory",
    "store_name",
]
