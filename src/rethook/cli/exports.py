"""The formats of ``rethook export``: one table, read by the command line (cheaply, at start)
and by the export itself (cli/reporting.py)."""

from __future__ import annotations

from rethook.frozen import Row


class Exporter(Row):
    """One ``export --format``: where its writer is, what it writes."""

    module: str
    function: str  # write(reader, out, **options) -> count
    binary: bool  # out is a binary file
    suffix: str  # the default output's suffix, after the input's name
    unit: str  # what the count counts
    help: str  # what --help says of it
    graph_only: bool = False  # needs a function_graph trace
    passes: int = 2  # times the writer reads the events (slices: orphans, then slices)


EXPORTERS: dict[str, Exporter] = {
    "perfetto": Exporter("rethook.output.perfetto", "write_perfetto", True, ".perfetto-trace",
                         "packets", "a native Perfetto trace (ui.perfetto.dev)"),
    "chrome": Exporter("rethook.output.chrome", "write_chrome", False, ".trace.json",
                       "events", "Trace Event Format JSON (chrome://tracing, Perfetto)"),
    "speedscope": Exporter("rethook.output.speedscope", "write_speedscope", False,
                           ".speedscope.json", "events", "speedscope's evented profiles",
                           graph_only=True),
    "folded": Exporter("rethook.output.folded", "write_folded", False, ".folded", "stacks",
                       "folded stacks for flame graphs (flamegraph.pl, speedscope)"),
    "pstats": Exporter("rethook.output.profile", "write_trace_pstats", True, ".pstats",
                       "functions", "a pstats profile (python -m pstats, snakeviz, gprof2dot)",
                       graph_only=True),
}
