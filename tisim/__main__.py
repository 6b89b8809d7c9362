"""``python -m tisim``: the same command line as ``tisim``."""

from tisim.cli.app import main

if __name__ == "__main__":
    main()
