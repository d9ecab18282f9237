"""The hook engine: per-function enabling and one shared return hook for any number of users.

Layout (arrows point one way: nothing here knows about tracers, probes or the command line):

- :mod:`~rethook.engine.registry` - every function of the loaded modules, with its canonical
  name (the kernel's ``available_filter_functions``), and an import hook for modules loaded later;
- :mod:`~rethook.engine.filters` - ftrace's filter syntax resolved against the registry;
- :mod:`~rethook.engine.core` - the hot path: ``sys.monitoring`` callbacks and shadow stacks;
- :mod:`~rethook.engine.engine` - users (``FtraceOps``, ``FgraphOps``), slots, dispatch tables,
  live changes and teardown;
- :mod:`~rethook.engine.toolid` - claiming one ``sys.monitoring`` tool id.
"""
