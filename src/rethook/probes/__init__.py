"""Probes built on the hook engine: kretprobe and fprobe (and, later, dynamic probe events)."""

from rethook.probes.kprobes import (
    Fprobe,
    Kretprobe,
    KretprobeInstance,
    ProbeError,
    register_fprobe,
    register_kretprobe,
    unregister_fprobe,
    unregister_kretprobe,
)

__all__ = [
    "Fprobe", "Kretprobe", "KretprobeInstance", "ProbeError", "register_fprobe",
    "register_kretprobe", "unregister_fprobe", "unregister_kretprobe",
]
