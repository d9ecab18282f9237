"""Loads a plugin the way plugin systems and benchmark runners do: past every import hook."""

import importlib.util
import os
import sys

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("greet_plugin",
                                              os.path.join(here, "plugins", "greet.py"))
plugin = importlib.util.module_from_spec(spec)
sys.modules["greet_plugin"] = plugin
spec.loader.exec_module(plugin)
for name in ("ada", "bob", "cy"):
    print(plugin.greet(name))
