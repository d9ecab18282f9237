"""Build of rethook's optional C extensions (everything else is in pyproject.toml).

- ``rethook.engine._ccore``: the C twin of the engine's hot path (docs/ccore.md);
- ``rethook.buffer._cring``: the ring buffer's hot side, fixed-size records per thread;
- ``rethook.tracers._native``: the native users (function, function_graph, the profiler),
  which write into ``_cring`` rings from C.

All are ``optional``: where they cannot be compiled (no C compiler, no Python headers, another
interpreter) the install still succeeds and rethook runs its pure-Python equivalents.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension("rethook.engine._ccore", sources=["src/rethook/engine/_ccore.c"],
                  optional=True),
        Extension("rethook.buffer._cring", sources=["src/rethook/buffer/_cring.c"],
                  depends=["src/rethook/buffer/cring.h"], optional=True),
        Extension("rethook.tracers._native", sources=["src/rethook/tracers/_native.c"],
                  include_dirs=["src/rethook/buffer"],
                  depends=["src/rethook/buffer/cring.h"], optional=True),
    ],
)
