"""The function profiler counts calls exactly as cProfile does, on a stdlib-heavy program."""

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


def _hits(fs):
    for _tid, code, hit, _time, _sq in fs.profiler.last.rows():
        yield code, hit
