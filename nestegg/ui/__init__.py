"""``nestegg ui``: a run inspector in the browser (``pip install 'nestegg[ui]'``).

A Starlette application rendering HTML on the server, with a little plain JavaScript for
live updates (server-sent events from the store's event log), expanding values, the fork
editor and the write buttons. Templates and static files ship inside this package.
"""

from __future__ import annotations

from nestegg.ui.app import UISettings, create_app

__all__ = ["UISettings", "create_app"]
