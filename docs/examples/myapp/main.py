"""``python -m myapp.main``: serve the requests of the examples and print their status."""

from myapp import Session, handle

REQUESTS = ["GET /", "GET /users/1", "GET /missing", "GET /users/2", "GET /teapot"]


def main(port=8080):
    session = Session(f"http://localhost:{port}")
    for request in REQUESTS:
        print(request, handle(session, request))


if __name__ == "__main__":
    main()
