"""``python -m nestegg.cli``: the nestegg command."""

from nestegg.cli import main

main()
