"""kretprobe and fprobe on real programs, with the kernel's semantics."""

import threading

import pytest

from programs import calls
from rethook.engine.core import FLAG_UNFINISHED
from rethook.probes import Fprobe, Kretprobe, ProbeError


def test_kretprobe_sees_arguments_at_entry_and_value_at_return(engine):
    seen = []

    def entry(ri, frame):
        ri.data["n"] = frame.f_locals["n"]  # the data pouch

    def handler(ri, retval):
        seen.append((ri.data["n"], retval, ri.exc))

    rp = Kretprobe("programs.calls.deep", handler=handler, entry_handler=entry)
    rp.register()
    try:
        calls.deep(3)
    finally:
        rp.unregister()
    assert seen == [(0, 0, None), (1, 1, None), (2, 2, None), (3, 3, None)]
    assert (rp.nhit, rp.nmissed) == (4, 0)


def test_kretprobe_entry_handler_can_skip_the_return(engine):
    seen = []
    rp = Kretprobe("deep", handler=lambda ri, v: seen.append(v),
                   entry_handler=lambda ri, frame: frame.f_locals["n"] % 2)
    rp.register()
    try:
        calls.deep(5)
    finally:
        rp.unregister()
    assert seen == [0, 2, 4]
    assert (rp.nhit, rp.nmissed) == (6, 0)  # a voluntary skip is not a miss


def test_kretprobe_records_exceptions(engine):
    seen = []
    rp = Kretprobe("raiser", handler=lambda ri, v: seen.append((v, ri.exc)))
    rp.register()
    try:
        with pytest.raises(calls.Boom) as info:
            calls.raiser(0, 2)
    finally:
        rp.unregister()
    assert seen == [(None, info.value)] * 3


def test_maxactive_limits_open_instances_and_counts_misses(engine):
    # deep(9) has ten calls open at once at its bottom; maxactive=4 admits the outer four
    seen = []
    rp = Kretprobe("deep", handler=lambda ri, v: seen.append(v), maxactive=4)
    rp.register()
    try:
        calls.deep(9)
        calls.deep(2)  # instances came back: all three admitted
    finally:
        rp.unregister()
    assert sorted(seen) == [0, 1, 2, 6, 7, 8, 9]
    assert (rp.nhit, rp.nmissed) == (13, 6)
    assert rp.nhit - rp.nmissed == len(seen)  # hits and returns never drift


def test_maxactive_across_threads(engine):
    started = [threading.Event() for _ in range(3)]
    release = threading.Event()
    seen = []
    rp = Kretprobe("block", handler=lambda ri, v: seen.append(v), maxactive=2)
    rp.register()
    try:
        threads = [threading.Thread(target=calls.block, args=(s, release)) for s in started]
        for t, s in zip(threads, started, strict=True):
            t.start()
            s.wait()
        release.set()
        for t in threads:
            t.join()
    finally:
        rp.unregister()
    assert seen == ["released", "released"]
    assert (rp.nhit, rp.nmissed) == (3, 1)


def test_kretprobe_on_many_functions_is_refused(engine):
    with pytest.raises(ProbeError, match="use an fprobe"):
        Kretprobe("is_*")


def test_kretprobe_on_nothing_is_refused(engine):
    with pytest.raises(ProbeError, match="nothing_like_this"):
        Kretprobe("nothing_like_this")


def test_fprobe_many_functions_entry_data_and_notfilter(engine):
    log = []

    def entry(fp, code, frame, data):
        data["arg"] = frame.f_locals.get("n")
        log.append(("entry", code.co_name))
        return 0

    def exit_(fp, code, frame, retval, data, exc, flags):
        log.append(("exit", code.co_name, data["arg"], retval))

    fp = Fprobe("is_*", notfilter="is_odd", entry_handler=entry, exit_handler=exit_)
    fp.register()
    try:
        calls.is_even(3)
    finally:
        fp.unregister()
    assert log == [("entry", "is_even"), ("entry", "is_even"),
                   ("exit", "is_even", 1, False), ("exit", "is_even", 3, False)]
    assert (fp.nhit, fp.nmissed) == (2, 0)


def test_fprobe_exit_only_if_entry_handler_returned_zero(engine):
    exits = []
    fp = Fprobe("deep", entry_handler=lambda fp, code, frame, d: frame.f_locals["n"] == 1,
                exit_handler=lambda fp, code, frame, retval, *rest: exits.append(retval))
    fp.register()
    try:
        calls.deep(2)
    finally:
        fp.unregister()
    assert exits == [0, 2]


def test_fprobe_disable_enable(engine):
    exits = []
    fp = Fprobe("programs.calls.leaf",
                exit_handler=lambda fp, code, frame, retval, *rest: exits.append(retval))
    fp.register()
    try:
        calls.leaf(1)
        fp.disable()
        calls.leaf(2)
        fp.enable()
        calls.leaf(3)
    finally:
        fp.unregister()
    assert exits == [2, 6]
    assert fp.nhit == 2


def test_fprobe_exit_handler_never_called_after_unregister(engine):
    started, release = threading.Event(), threading.Event()
    exits = []
    fp = Fprobe("block", exit_handler=lambda fp, code, frame, retval, d, exc, flags:
                exits.append((retval, flags)))
    fp.register()
    t = threading.Thread(target=calls.block, args=(started, release))
    t.start()
    started.wait()
    fp.unregister()
    assert exits == [(None, FLAG_UNFINISHED)]
    release.set()
    t.join()
    assert exits == [(None, FLAG_UNFINISHED)]


def test_probes_share_one_hook_with_other_users(engine):
    from recorder import Recorder

    rec = Recorder("programs.calls.leaf")
    seen = []
    rp = Kretprobe("programs.calls.leaf", handler=lambda ri, v: seen.append(v))
    fp = Fprobe("programs.calls.leaf",
                exit_handler=lambda fp, code, frame, retval, *r: seen.append(-retval))
    engine.register_ftrace_graph(rec)
    rp.register()
    fp.register()
    try:
        assert engine.enabled_functions()[0][0].name == "programs.calls.leaf"
        assert engine.enabled_functions()[0][2] == 3  # one function, three users, one hook
        calls.leaf(5)
    finally:
        fp.unregister()
        rp.unregister()
        engine.unregister_ftrace_graph(rec)
    assert seen == [-10, 10]  # reverse order of registration
