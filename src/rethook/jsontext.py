"""JSON text for what rethook writes as a program starts and ends (the trace file's META, PROC
and STATS chunks, a followed run's settings and ledger), without importing :mod:`json`.

``import json`` imports ``re``, and with it ``enum``, ``functools`` and ``collections``:
~10 ms of every recording's start-up when the program does not import them itself (most of
pyperformance's programs do not). What ``json.dumps`` runs underneath is the interpreter's C
encoder, ``_json.make_encoder``: :func:`dumps` calls it as ``json.dumps`` does, so the text
is the same (``tests/test_jsontext.py``), and uses ``json.dumps`` itself where ``_json`` is
missing. Reading stays ``json.loads``: readers are not on the start-up path.

This module imports nothing of rethook's: every layer may use it.
"""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

try:
    from _json import encode_basestring, encode_basestring_ascii, make_encoder
except ImportError:  # (another interpreter, or a CPython built without it)
    make_encoder = None

__all__ = ["dumps"]


def _refuse(value: object) -> Any:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def dumps(value: object, *, ensure_ascii: bool = True,
          default: Callable[[Any], Any] | None = None, sort_keys: bool = False) -> str:
    """``json.dumps(value, ensure_ascii=..., default=..., sort_keys=...)``, the same text."""
    if make_encoder is None:
        import json

        return json.dumps(value, ensure_ascii=ensure_ascii, default=default,
                          sort_keys=sort_keys)
    encode_str = encode_basestring_ascii if ensure_ascii else encode_basestring
    if isinstance(value, str):
        return encode_str(value)
    # (markers, default, str encoder, indent, key separator, item separator, sort_keys,
    # skipkeys, allow_nan): json.JSONEncoder.iterencode's call with json.dumps's defaults
    encode = make_encoder({}, default or _refuse, encode_str, None, ": ", ", ", sort_keys,
                          False, True)
    return "".join(encode(value, 0))
