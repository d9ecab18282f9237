"""The ``rethook`` command (:mod:`rethook.cli.main`), and its entry point (:func:`entry`: not
``main``, which would be shadowed by the submodule of that name once it is imported)."""


def entry() -> None:
    """The console script ``rethook`` and ``python -m rethook``. A plain ``rethook record``,
    ``stream`` or ``profile`` runs without click (:mod:`rethook.cli.quick`); everything
    else goes through click.
    Importing click and the command line makes thousands of objects and no garbage, yet sets
    off several young collections (~4 ms): the cyclic GC is paused while they are imported
    (rethook.gcpause), and what exists when the program starts is frozen
    (:func:`rethook.gcpause.own_process`)."""
    import sys

    from rethook import gcpause
    from rethook.cli import quick

    gcpause.own_process()
    quick.run(sys.argv[1:])  # returns if click must read the command line
    with gcpause.paused():
        from rethook.cli.main import main as run
    run()
