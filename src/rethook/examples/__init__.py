"""Example programs bundled with rethook (``rethook demo`` records :mod:`demo`).

They are ordinary scripts: run them with ``python``, or trace them with ``rethook record``.
"""

from __future__ import annotations

import os


def demo_path() -> str:
    """The path of the demo script (``rethook demo`` runs it as ``__main__``)."""
    return os.path.join(os.path.dirname(os.path.abspath(__file__)), "demo.py")
