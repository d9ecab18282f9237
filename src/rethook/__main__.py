"""``python -m rethook``: the command line."""

from rethook.cli import main

if __name__ == "__main__":
    main()
