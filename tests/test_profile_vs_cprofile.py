"""The function profiler counts calls exactly as cProfile does, on a stdlib-heavy program:
per function (calls and primitive calls) and per caller -> callee edge."""

import cProfile
import gc
import pstats

from programs import stdlib_heavy
from rethook.control import Tracefs


def test_hits_equal_cprofile_calls_function_by_function(engine):
    gc.disable()  # gc callbacks (hypothesis registers one) would run at unpredictable points
    fs = Tracefs()
    prof = cProfile.Profile()
    try:
        fs.write("function_profile_enabled", "1")  # every function: the stdlib included
        prof.enable()
        result = stdlib_heavy.main()
        prof.disable()
        fs.write("function_profile_enabled", "0")
    finally:
        fs.close()
        gc.enable()
    assert result[0] > 0

    ours = {}
    for s_code, hit in _hits(fs):
        ours[(s_code.co_filename, s_code.co_firstlineno, s_code.co_name)] = hit
    theirs = {key: value[1] for key, value in pstats.Stats(prof).stats.items()
              if not key[0].startswith("~")}  # "~": C functions, which rethook does not hook
    assert len(theirs) > 50
    missing = {k: v for k, v in theirs.items() if k not in ours and "rethook" not in k[0]}
    assert not missing, f"cProfile saw calls the profiler did not: {sorted(missing)[:5]}"
    differ = {k: (ours[k], v) for k, v in theirs.items() if k in ours and ours[k] != v}
    assert not differ, f"hit counts differ (ours, cProfile's): {sorted(differ.items())[:5]}"
    extra = set(ours) - set(theirs)
    assert not extra, f"the profiler saw calls cProfile did not: {sorted(extra)[:5]}"

    # primitive (not recursive) calls, function by function
    prims = {_key(row[1]): row[3] for row in fs.profiler.last.rows()}
    cstats = pstats.Stats(prof).stats
    differ = {k: (prims[k], v[0]) for k, v in cstats.items() if k in prims and prims[k] != v[0]}
    assert not differ, f"primitive calls differ (ours, cProfile's): {sorted(differ.items())[:5]}"

    # caller -> callee edges: where cProfile's callers of a function are all Python functions
    # rethook saw (a C function between two Python ones is a caller only to cProfile)
    edges: dict = {}
    for _tid, caller, code, hit, prim, _total, _self in fs.profiler.last.edges():
        got = edges.setdefault(_key(code), {}).setdefault(_key(caller), [0, 0])
        got[0] += hit
        got[1] += prim
    compared = 0
    for callee, (_cc, _nc, _tt, _ct, callers) in cstats.items():
        if callee not in ours or not all(c in ours for c in callers):
            continue
        want = {c: [nc, cc] for c, (nc, cc, _t, _c) in callers.items()}
        assert edges.get(callee, {}) == want, callee
        compared += 1
    assert compared > 30


def _key(code):
    return (code.co_filename, code.co_firstlineno, code.co_name)


def _hits(fs):
    for row in fs.profiler.last.rows():
        yield row[1], row[2]
