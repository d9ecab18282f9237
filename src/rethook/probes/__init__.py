"""Probes built on the hook engine: kretprobe and fprobe (:mod:`.kprobes`), and the dynamic
probe events of the tracefs files (:mod:`.dynamic`, :mod:`.events`).

The kretprobe API is exported here but loaded at its first use: a recording without probes
imports :mod:`.dynamic` (the ``dynamic_events`` file) and nothing else of this package.
"""

from __future__ import annotations

__all__ = [
    "Fprobe", "Kretprobe", "KretprobeInstance", "ProbeError", "register_fprobe",
    "register_kretprobe", "unregister_fprobe", "unregister_kretprobe",
]


def __getattr__(name: str) -> object:
    if name in __all__:
        from rethook.probes import kprobes

        return getattr(kprobes, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
