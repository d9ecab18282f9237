"""Build of rethook's optional C extension (everything else is in pyproject.toml).

``rethook.engine._ccore`` is the C twin of the engine's hot path (docs/ccore.md). It is
``optional``: where it cannot be compiled (no C compiler, no Python headers, another
interpreter) the install still succeeds and rethook runs on its pure-Python core.
"""

from setuptools import Extension, setup

setup(
    ext_modules=[
        Extension(
            "rethook.engine._ccore",
            sources=["src/rethook/engine/_ccore.c"],
            optional=True,
        ),
    ],
)
