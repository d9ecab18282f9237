"""``python -m rethook``: the command line."""

from rethook.cli.main import main

if __name__ == "__main__":
    main()
