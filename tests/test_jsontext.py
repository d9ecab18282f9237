"""rethook.jsontext writes what json.dumps writes, without importing json."""

from __future__ import annotations

import json
import math

import pytest
from hypothesis import given
from hypothesis import strategies as st

from rethook import jsontext

_SCALARS = (st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True) |
            st.text())
_VALUES = st.recursive(_SCALARS, lambda inner: st.lists(inner) | st.tuples(inner, inner) |
                       st.dictionaries(st.text(), inner), max_leaves=30)


@given(_VALUES, st.booleans(), st.booleans())
def test_the_same_text_as_json_dumps(value, ensure_ascii, sort_keys):
    assert jsontext.dumps(value, ensure_ascii=ensure_ascii, sort_keys=sort_keys) == \
        json.dumps(value, ensure_ascii=ensure_ascii, sort_keys=sort_keys)


def test_default_and_refusal():
    odd = {"path": object(), "n": math.inf, "s": "\udcff\n\u00e9"}
    assert jsontext.dumps(odd, default=str, ensure_ascii=False) == \
        json.dumps(odd, default=str, ensure_ascii=False)
    with pytest.raises(TypeError, match="not JSON serializable"):
        jsontext.dumps({"x": object()})
    with pytest.raises(ValueError):  # a cycle, as json.dumps says
        cyclic: list = []
        cyclic.append(cyclic)
        jsontext.dumps(cyclic)
