"""Loads code the way plugin systems and benchmark runners do, past the import hook: a plugin
with spec_from_file_location + exec_module; also a module from a zip file (zipimport) and a
frozen module of the interpreter."""

import importlib.util
import os
import sys
import tempfile
import zipfile

here = os.path.dirname(os.path.abspath(__file__))
spec = importlib.util.spec_from_file_location("greet_plugin",
                                              os.path.join(here, "plugins", "greet.py"))
plugin = importlib.util.module_from_spec(spec)
sys.modules["greet_plugin"] = plugin
spec.loader.exec_module(plugin)
for name in ("ada", "bob", "cy"):
    print(plugin.greet(name))

with tempfile.TemporaryDirectory() as tmp:
    archive = os.path.join(tmp, "lib.zip")
    with zipfile.ZipFile(archive, "w") as z:
        z.writestr("zipped_mod.py", "def zipped(x):\n    return x * 7\n")
    sys.path.insert(0, archive)
    import zipped_mod

    print(zipped_mod.zipped(3), zipped_mod.zipped(4))

import __hello__  # noqa: E402 - frozen into the interpreter

__hello__.main()
