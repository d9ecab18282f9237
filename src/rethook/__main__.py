"""``python -m rethook``: the command line."""

from rethook.cli import entry

if __name__ == "__main__":
    entry()
