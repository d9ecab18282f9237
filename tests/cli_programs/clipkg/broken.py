"""``python -m clipkg.broken``: an uncaught exception, whose traceback starts in runpy."""


def fail():
    raise LookupError("nothing here")


fail()
