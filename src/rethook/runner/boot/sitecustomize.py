"""rethook's start-up hook for the Python programs a traced run starts (docs/cli.md,
"Child processes").

A process started by a traced program gets this directory first on PYTHONPATH and the run's
directory in RETHOOK_FOLLOW. Python imports this module while it starts (the ``site``
module's ``sitecustomize`` step). It puts everything back as the program would see it
untraced -- this directory off ``sys.path``, PYTHONPATH and RETHOOK_FOLLOW* restored in
``os.environ`` -- loads the real ``sitecustomize`` if there is one, and starts tracing with
the run's settings (rethook.runner.follow.boot). Only the standard library is used until
rethook is imported, so that a Python that cannot import rethook says why instead of failing.
"""

import os
import sys


def _start():
    here = os.path.dirname(os.path.abspath(__file__))
    rundir = os.environ.pop("RETHOOK_FOLLOW", None)
    saved = os.environ.pop("RETHOOK_FOLLOW_PYTHONPATH", None)
    if saved is not None:
        if saved == "-":
            os.environ.pop("PYTHONPATH", None)
        else:
            os.environ["PYTHONPATH"] = saved
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or os.curdir) != here]
    me = sys.modules.pop("sitecustomize", None)
    try:
        import sitecustomize  # noqa: F401 - the real one, if any
    except ImportError as e:
        if getattr(e, "name", None) != "sitecustomize":
            raise
        if me is not None:
            sys.modules["sitecustomize"] = me  # importlib expects the name to stay bound
    if not rundir:
        return
    if sys.version_info < (3, 12):
        _untraced(rundir, "Python {}.{} has no sys.monitoring (rethook needs 3.12 or newer)"
                  .format(*sys.version_info[:2]))
        return
    try:
        from rethook.runner.follow import boot
    except BaseException as e:  # noqa: BLE001 - said in the run's summary
        _untraced(rundir, "cannot import rethook ({}: {})".format(type(e).__name__, e))
        return
    boot(rundir)


def _untraced(rundir, reason):
    try:
        with open(os.path.join(rundir, "{}.untraced".format(os.getpid())), "w") as f:
            f.write(reason)
    except OSError:
        pass


_start()
