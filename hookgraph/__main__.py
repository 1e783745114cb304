"""``python -m hookgraph [overrides]``: see the README."""

from hookgraph.cli.app import main

if __name__ == "__main__":
    main()
