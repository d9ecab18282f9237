"""myapp: the small web client the examples in README.md and docs/ trace.

No network: ``Session.send`` answers from a table, as a server would (200, 404, 418), so
every example runs anywhere and always gives the same answers.
"""

ANSWERS = {"/": 200, "/users/1": 200, "/users/2": 200, "/teapot": 418}


class Session:
    """A connection to one server."""

    def __init__(self, base):
        self.base = base
        self.sent = 0

    def send(self, url):
        """Send a request for ``url``; returns the response's status code."""
        self.sent += 1
        return ANSWERS.get(url.removeprefix(self.base), 404)


def parse(request):
    """``"GET /users/1"`` -> ``"/users/1"``."""
    method, path = request.split()
    return path


def handle(session, request):
    """Serve one request: parse it, send it on, return the status code."""
    return session.send(session.base + parse(request))
