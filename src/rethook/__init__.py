"""rethook: the Linux kernel's function hook infrastructure, rebuilt for Python programs."""

__version__ = "0.1.0"
