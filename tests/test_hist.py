"""Histogram triggers: parsing, aggregation, the hist file's exact shape, limits, errors."""

from __future__ import annotations

import threading

import pytest

from rethook.probes.evfilter import FilterSyntaxError
from rethook.probes.hist import (
    HistRow,
    HistTrigger,
    parse_hist_trigger,
    render_hist_file,
)
from rethook.probes.triggers import parse_trigger

FIELDS = {"len": "u64", "size": "u64", "ret": "s64", "dur": "f64", "name": "str",
          "ok": "bool"}


class Fault:
    pass


FAULT = Fault()


def hist(text: str) -> HistTrigger:
    return parse_hist_trigger(text, FIELDS)


def feed(h: HistTrigger, records) -> HistTrigger:
    for r in records:
        h.fire(r)
    return h


def header(info: str) -> str:
    return f"# event histogram\n#\n# trigger info: {info}\n#\n\n"


def totals(hits: int, entries: int, dropped: int = 0) -> str:
    return f"\nTotals:\n    Hits: {hits}\n    Entries: {entries}\n    Dropped: {dropped}\n"


# ---------------------------------------------------------------------------------------------
# Exact output

def test_log2_keys():
    h = feed(hist("hist:keys=len.log2"),
             [{"len": v} for v in (3, 5, 8, 20, 31, 32, 33, 100, 128)])
    assert h.render() == header(
        "hist:keys=len.log2:vals=hitcount:sort=hitcount:size=2048 [active]") + (
        "{ len: ~ 2^2  } hitcount:          1\n"
        "{ len: ~ 2^6  } hitcount:          1\n"
        "{ len: ~ 2^3  } hitcount:          2\n"
        "{ len: ~ 2^7  } hitcount:          2\n"
        "{ len: ~ 2^5  } hitcount:          3\n"
    ) + totals(9, 5)


@pytest.mark.parametrize("value,power", [
    (0, 0), (1, 0), (2, 1), (3, 2), (4, 2), (5, 3), (1000, 10), (1024, 10), (1025, 11),
    ((1 << 64) - 1, 64),
])
def test_log2_is_the_power_of_two_at_or_above(value, power):
    h = feed(hist("hist:keys=len.log2"), [{"len": value}])
    assert h.rows()[0].key == (power,)
    line = h.render().splitlines()[5]
    assert line.startswith(f"{{ len: ~ 2^{power:<2} }}")


def test_log2_of_signed_and_float_values():
    h = feed(hist("hist:keys=ret.log2,dur.log2"), [{"ret": -1, "dur": 2.5}, {"ret": 7, "dur": 0.1}])
    assert sorted(r.key for r in h.rows()) == [(3, 0), (64, 2)]


def test_buckets_keys_with_a_val():
    h = feed(hist("hist:keys=size.buckets=1000:vals=len"), [
        {"size": 0, "len": 1}, {"size": 999, "len": 2}, {"size": 1000, "len": 3},
        {"size": 1500, "len": 4}, {"size": 2999, "len": 5}])
    assert h.render() == header(
        "hist:keys=size.buckets=1000:vals=hitcount,len:sort=hitcount:size=2048 [active]") + (
        "{ size: ~ 2000-2999 } hitcount:          1  len:          5\n"
        "{ size: ~ 0-999 } hitcount:          2  len:          3\n"
        "{ size: ~ 1000-1999 } hitcount:          2  len:          7\n"
    ) + totals(5, 3)


def test_bucket_spelling_and_signed_buckets():
    h = feed(hist("hist:keys=ret.bucket=10"), [{"ret": -5}, {"ret": 5}])
    assert h.text.startswith("hist:keys=ret.buckets=10:")
    assert [r.key for r in h.rows()] == [(-10,), (0,)]
    assert "{ ret: ~ -10--1 }" in h.render()


def test_string_and_multiple_keys_sorted_by_val_descending():
    h = feed(hist("hist:keys=name,ret:vals=len:sort=len.descending"), [
        {"name": "json.loads", "ret": 0, "len": 10},
        {"name": "json.loads", "ret": 0, "len": 30},
        {"name": "json.dumps", "ret": -2, "len": 100},
        {"name": "json.loads", "ret": 1, "len": 1},
    ])
    assert h.render() == header(
        "hist:keys=name,ret:vals=hitcount,len:sort=len.descending:size=2048 [active]") + (
        f"{{ name: {'json.dumps':<50}, ret:         -2 }} hitcount:          1  len:        100\n"
        f"{{ name: {'json.loads':<50}, ret:          0 }} hitcount:          2  len:         40\n"
        f"{{ name: {'json.loads':<50}, ret:          1 }} hitcount:          1  len:          1\n"
    ) + totals(4, 3)


def test_plain_numeric_keys_two_vals_and_hex():
    h = feed(hist("hist:keys=len.hex:vals=ret,size.hex:sort=hitcount.descending"), [
        {"len": 255, "ret": -3, "size": 16}, {"len": 255, "ret": 1, "size": 16},
        {"len": 4096, "ret": 5, "size": 1}])
    assert h.render() == header(
        "hist:keys=len.hex:vals=hitcount,ret,size.hex:sort=hitcount.descending:size=2048"
        " [active]") + (
        "{ len: ff } hitcount:          2  ret:         -2  size:         20\n"
        "{ len: 1000 } hitcount:          1  ret:          5  size:          1\n"
    ) + totals(3, 2)


def test_execname_on_common_pid():
    h = feed(hist("hist:keys=common_pid.execname"), [
        {"common_pid": 4242, "comm": "worker-1"}, {"common_pid": 4242, "comm": "renamed"},
        {"common_pid": 7, "comm": "MainThread"}])
    out = h.render()
    assert h.text == ("hist:keys=common_pid.execname:vals=hitcount:sort=hitcount:size=2048"
                      " [active]")
    assert "{ common_pid: MainThread      [         7] } hitcount:          1\n" in out
    assert "{ common_pid: worker-1        [      4242] } hitcount:          2\n" in out


def test_comm_string_key():
    h = feed(hist("hist:keys=comm"), [{"comm": "a"}, {"comm": "b"}, {"comm": "a"}])
    assert h.render().splitlines()[5:7] == [
        f"{{ comm: {'b':<50} }} hitcount:          1",
        f"{{ comm: {'a':<50} }} hitcount:          2",
    ]


def test_float_and_bool_fields():
    h = feed(hist("hist:keys=ok:vals=dur"), [
        {"ok": True, "dur": 0.5}, {"ok": True, "dur": 0.25}, {"ok": False, "dur": 2}])
    assert h.render().splitlines()[5:7] == [
        "{ ok:          0 } hitcount:          1  dur:          2",
        "{ ok:          1 } hitcount:          2  dur:       0.75",
    ]
    g = feed(hist("hist:keys=dur"), [{"dur": 1.5}])
    assert g.render().splitlines()[5] == "{ dur:        1.5 } hitcount:          1"


def test_faulted_keys_group_together_and_faulted_vals_add_nothing():
    h = feed(hist("hist:keys=len,name:vals=ret"), [
        {"len": 1, "name": "a", "ret": 5}, {"len": FAULT, "name": "a", "ret": FAULT},
        {"name": "a", "ret": 2}, {"len": 1, "name": None, "ret": 1}])
    lines = h.render().splitlines()[5:8]
    assert lines == [
        f"{{ len:          1, name: {'a':<50} }} hitcount:          1  ret:          5",
        f"{{ len:          1, name: {'(fault)':<50} }} hitcount:          1  ret:          1",
        f"{{ len:    (fault), name: {'a':<50} }} hitcount:          2  ret:          2",
    ]


def test_sort_by_key_and_secondary_sort():
    recs = [{"len": v, "ret": r} for v, r in [(3, 1), (1, 1), (2, 2), (2, 2), (1, 9)]]
    by_key = feed(hist("hist:keys=len:sort=len"), recs)
    assert [r.key for r in by_key.rows()] == [(1,), (2,), (3,)]
    desc = feed(hist("hist:keys=len:sort=len.descending"), recs)
    assert [r.key for r in desc.rows()] == [(3,), (2,), (1,)]
    two = feed(hist("hist:keys=len:vals=ret:sort=hitcount.descending,ret.ascending"), recs)
    assert [(r.key, r.hitcount, r.vals) for r in two.rows()] == [
        ((2,), 2, (4,)), ((1,), 2, (10,)), ((3,), 1, (1,))]
    assert two.text.startswith("hist:keys=len:vals=hitcount,ret:sort=hitcount.descending,ret:")
    log = feed(hist("hist:keys=len.log2:sort=len"), recs)
    assert "sort=len.log2:" in log.text


def test_fields_used():
    h = hist('hist:keys=common_pid.execname:vals=len if name ~ "j*"')
    assert h.fields_used == {"common_pid", "comm", "len", "name"}
    assert parse_trigger("traceon if ret < 0", FIELDS).fields_used == {"ret"}
    assert parse_trigger("traceon", FIELDS).fields_used == frozenset()


def test_rows_are_typed():
    h = feed(hist("hist:keys=name:vals=len"), [{"name": "x", "len": 3}])
    assert h.rows() == [HistRow(("x",), 1, (3,), None)]


# ---------------------------------------------------------------------------------------------
# Size, Dropped, Totals

def test_dropped_counts_hits_that_need_a_new_entry_when_full():
    h = hist("hist:keys=len:size=128")
    for v in range(200):
        h.update({"len": v})
    for v in range(10):  # existing entries still count when the table is full
        h.update({"len": v})
    h.update({"len": 500})
    assert (h.hits, h.entries, h.dropped) == (211, 128, 73)
    assert h.render().endswith(totals(211, 128, 73))
    assert sum(r.hitcount for r in h.rows()) == 211 - 73


@pytest.mark.parametrize("size,shown", [
    ("128", 128), ("100", 128), ("129", 256), ("0x800", 2048), ("131072", 131072),
])
def test_size_rounds_up_to_a_power_of_two(size, shown):
    assert f":size={shown} " in hist(f"hist:keys=len:size={size}").text


def test_hits_equal_updates_across_threads():
    h = hist("hist:keys=len:vals=ret")
    n_threads, per_thread = 8, 4000

    def worker(t):
        for i in range(per_thread):
            h.fire({"len": i % 7, "ret": 1})

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    rows = h.rows()
    assert h.hits == n_threads * per_thread == sum(r.hitcount for r in rows)
    assert sum(r.vals[0] for r in rows) == n_threads * per_thread and h.entries == 7


def test_filter_pause_and_clear():
    h = hist("hist:keys=len if len > 2")
    feed(h, [{"len": 1}, {"len": 3}, {"len": FAULT}, {"len": 4}])
    assert (h.hits, h.entries) == (2, 2)
    assert h.text == ("hist:keys=len:vals=hitcount:sort=hitcount:size=2048 if len > 2"
                      " [active]")
    h.update({"len": 0})  # update() aggregates unconditionally
    assert h.hits == 3
    h.paused = True
    h.fire({"len": 9})
    assert h.hits == 3 and h.text.endswith(" [paused]")
    h.clear()
    assert (h.hits, h.entries, h.dropped) == (0, 0, 0)
    assert h.render() == header(h.text) + totals(0, 0)


def test_hist_file_with_several_triggers():
    a = feed(hist("hist:keys=len"), [{"len": 1}])
    b = feed(hist("hist:keys=name"), [{"name": "x"}])
    out = render_hist_file([a, parse_trigger("traceon", FIELDS), b])
    assert out == a.render() + "\n\n" + b.render()
    assert render_hist_file([]) == ""


def test_trigger_write_returns_a_hist_trigger():
    h = parse_trigger("  hist:keys=len:vals=ret:sort=ret.descending:size=256 if ret < 0 ",
                      FIELDS)
    assert isinstance(h, HistTrigger)
    assert h.text == ("hist:keys=len:vals=hitcount,ret:sort=ret.descending:size=256"
                      " if ret < 0 [active]")


@pytest.mark.parametrize("text,readback", [
    ("hist:key=len:val=ret", "hist:keys=len:vals=hitcount,ret:sort=hitcount:size=2048"),
    ("hist:keys=len:values=hitcount,ret", "hist:keys=len:vals=hitcount,ret:sort=hitcount"
     ":size=2048"),
    ("hist:vals=ret,hitcount:keys=len", "hist:keys=len:vals=hitcount,ret:sort=hitcount"
     ":size=2048"),
    ("hist:keys=len:sort=hitcount.ascending", "hist:keys=len:vals=hitcount:sort=hitcount"
     ":size=2048"),
    ("hist:keys=len,name,ret:clock=global", "hist:keys=len,name,ret:vals=hitcount"
     ":sort=hitcount:size=2048"),
    ("hist:name=foo:keys=len", "hist:name=foo:keys=len:vals=hitcount:sort=hitcount:size=2048"),
    ("hist keys=len", "hist:keys=len:vals=hitcount:sort=hitcount:size=2048"),
    ("hist:keys=COMM", "hist:keys=COMM:vals=hitcount:sort=hitcount:size=2048"),
])
def test_readback_normalizes(text, readback):
    assert parse_trigger(text, FIELDS).text == readback + " [active]"


# ---------------------------------------------------------------------------------------------
# Errors

@pytest.mark.parametrize("text,message,pos", [
    ("hist", "No keys specified", 4),
    ("hist:vals=len", "No keys specified", 5),
    ("hist:keys=", "Empty assignment", 5),
    ("hist:keys=nope", "Couldn't find field", 10),
    ("hist:keys=len,nope", "Couldn't find field", 14),
    ("hist:keys=len,", "Couldn't find field", 14),
    ("hist:keys=len.log3", "Invalid field modifier", 14),
    ("hist:keys=len.execname", "Invalid field modifier", 14),
    ("hist:keys=len.buckets=0", "Invalid field modifier", 14),
    ("hist:keys=len.buckets", "Invalid field modifier", 14),
    ("hist:keys=len.sym", "Invalid field modifier", 14),
    ("hist:keys=name.log2", "Invalid field modifier", 15),
    ("hist:keys=dur.hex", "Invalid field modifier", 14),
    ("hist:keys=len,ret,name,ok", "Too many keys (Max = 3)", 23),
    ("hist:keys=len:vals=name", "Values must be numeric fields", 19),
    ("hist:keys=len:vals=len.log2", "Invalid field modifier", 23),
    ("hist:keys=len:vals=nope", "Couldn't find field", 19),
    ("hist:keys=len:vals=len,ret,dur", "Too many values (Max = 2, plus hitcount)", 27),
    ("hist:keys=len:sort=", "Empty assignment", 14),
    ("hist:keys=len:sort=nope", "Sort field must be a key or a val", 19),
    ("hist:keys=len:sort=len.up", "Invalid sort modifier", 23),
    ("hist:keys=len:sort=len.log2", "Invalid sort modifier", 23),
    ("hist:keys=len:sort=,len", "Empty sort field", 14),
    ("hist:keys=len:sort=.descending", "Empty sort field", 14),
    ("hist:keys=len:sort=len,hitcount,len", "Too many sort fields (Max = 2)", 14),
    ("hist:keys=len:size=64", "Invalid size (must be 128 to 131072)", 19),
    ("hist:keys=len:size=131073", "Invalid size (must be 128 to 131072)", 19),
    ("hist:keys=len:size=0", "Invalid size (must be 128 to 131072)", 19),
    ("hist:keys=len:size=big", "Invalid size (must be 128 to 131072)", 19),
    ("hist:keys=len:foo",
     "Invalid hist trigger attribute (variables and actions are not supported)", 14),
    ("hist:keys=len:ts0=len",
     "Invalid hist trigger attribute (variables and actions are not supported)", 14),
    ("hist:keys=len:onmax($x).save(len)",
     "Invalid hist trigger attribute (variables and actions are not supported)", 14),
    ("hist:keys=len if", "Missing filter after 'if'", 16),
])
def test_hist_errors(text, message, pos):
    with pytest.raises(FilterSyntaxError) as info:
        parse_trigger(text, FIELDS, event="kprobes:p_loads")
    e = info.value
    assert (e.message, e.position, e.location) == (message, pos, "hist:kprobes:p_loads"), str(e)


def test_hist_filter_error_is_a_filter_error_in_the_whole_command():
    with pytest.raises(FilterSyntaxError) as info:
        parse_hist_trigger("hist:keys=len if nope > 1", FIELDS)
    e = info.value
    assert str(e) == (
        "event filter parse error: error: Field not found\n"
        "  Command: hist:keys=len if nope > 1\n"
        "                            ^"
    )


def test_hist_error_renders_with_caret():
    with pytest.raises(FilterSyntaxError) as info:
        parse_hist_trigger("hist:keys=len.log3:vals=ret", FIELDS, event="kprobes:p_loads")
    assert str(info.value) == (
        "hist:kprobes:p_loads: error: Invalid field modifier\n"
        "  Command: hist:keys=len.log3:vals=ret\n"
        "                         ^"
    )
