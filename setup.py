"""Build of rethook's optional C extensions (everything else is in pyproject.toml).

- ``rethook.engine._clock``: the trace clock (the TSC scaled onto CLOCK_MONOTONIC where the
  kernel trusts it);
- ``rethook.engine._ccore``: the C twin of the engine's hot path (docs/ccore.md);
- ``rethook.engine._cregistry``: the registry's naming of a module's functions as it loads;
- ``rethook.buffer._cring``: the ring buffer's hot side, fixed-size records per thread;
- ``rethook.buffer._tfenc``: the trace file writer's column encoder (same bytes as
  tracefile.py's);
- ``rethook.tracers._native``: the native users (function, function_graph, the profiler),
  which write into ``_cring`` rings from C.

All are ``optional``: where they cannot be compiled (no C compiler, no Python headers, another
interpreter) the install still succeeds and rethook runs its pure-Python equivalents.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rethook.engine._clock", sources=["src/rethook/engine/_clock.c"],
                  depends=["src/rethook/engine/clock.h"], optional=True),
        Extension("rethook.engine._ccore", sources=["src/rethook/engine/_ccore.c"],
                  depends=["src/rethook/engine/clock.h", "src/rethook/engine/drainround.h",
                           "src/rethook/engine/fgraph_direct.h", "src/rethook/engine/pyframe.h",
                           "src/rethook/engine/parktable.h", "src/rethook/engine/fasttstate.h",
                           "src/rethook/engine/ptrhash.h"],
                  optional=True),
        Extension("rethook.engine._cregistry", sources=["src/rethook/engine/_cregistry.c"],
                  optional=True),
        Extension("rethook.buffer._cring", sources=["src/rethook/buffer/_cring.c"],
                  depends=["src/rethook/buffer/cring.h"], optional=True),
        Extension("rethook.buffer._tfenc", sources=["src/rethook/buffer/_tfenc.c"],
                  depends=["src/rethook/buffer/cring.h", "src/rethook/engine/drainround.h"],
                  optional=True),
        Extension("rethook.tracers._native", sources=["src/rethook/tracers/_native.c"],
                  include_dirs=["src/rethook/buffer", "src/rethook/engine"],
                  depends=["src/rethook/buffer/cring.h", "src/rethook/engine/clock.h",
                           "src/rethook/engine/fgraph_direct.h",
                           "src/rethook/engine/pyframe.h", "src/rethook/engine/ptrhash.h"],
                  optional=True),
    ],
)
