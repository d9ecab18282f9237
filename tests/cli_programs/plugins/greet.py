"""A plugin, loaded by plugin_host.py with spec_from_file_location + exec_module."""


def greet(name):
    return "hello " + shout(name)


def shout(s):
    return s.upper()
