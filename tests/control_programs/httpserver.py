"""A long-running service for the control-channel tests: an HTTP server from the standard
library whose handler threads hand work to a thread pool.

Prints its port, serves until GET /quit, then prints how many requests it answered.
GET /N answers {"n": N, "result": work(N), "requests": COUNT}; GET /state answers the count.
"""

import json
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

POOL = ThreadPoolExecutor(max_workers=2, thread_name_prefix="worker")
STATE = {"requests": 0}
LOCK = threading.Lock()


def square(i):
    return i * i


def work(n):
    total = 0
    for i in range(n):
        total += square(i)
    return total


def handle(path):
    n = int(path.strip("/"))
    result = POOL.submit(work, n).result()
    with LOCK:
        STATE["requests"] += 1
        count = STATE["requests"]
    return {"n": n, "result": result, "requests": count}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path == "/state":
            body = dict(STATE)
        elif self.path == "/quit":
            body = {"bye": True}
        else:
            body = handle(self.path)
        data = json.dumps(body).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)
        if self.path == "/quit":
            # answered first: the handler threads are daemons, and the process may end
            # as soon as serve_forever returns
            self.wfile.flush()
            threading.Thread(target=server.shutdown).start()

    def log_message(self, format, *args):
        pass


server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
print(server.server_address[1], flush=True)
server.serve_forever(poll_interval=0.05)
server.server_close()
POOL.shutdown()
print("answered", STATE["requests"])
sys.exit(0)
