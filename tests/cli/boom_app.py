"""A module whose code fails while it is imported (``--app tests.cli.boom_app:pipeline``)."""

raise RuntimeError("boom")
