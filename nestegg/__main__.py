"""``python -m nestegg``: the nestegg command."""

from nestegg.cli import main

main()
