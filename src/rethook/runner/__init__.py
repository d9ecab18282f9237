"""The program runner: rethook owns the traced program's whole life.

* :mod:`~rethook.runner.program` finds, compiles and runs a script, ``-m`` module or ``-c``
  command exactly as ``python`` does;
* :mod:`~rethook.runner.settings` holds trace-cmd's flags as data and turns them into tracefs
  writes (with the default filter: the program's own code);
* :mod:`~rethook.runner.observers` watch a run, one per output mode (record, stream, profile),
  with the drain thread they need;
* :mod:`~rethook.runner.run` ties them together for one run.
"""
