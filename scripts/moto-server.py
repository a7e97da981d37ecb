"""moto's S3 server with every request serialised behind one lock.

moto 5 checks a conditional PUT without a lock: `put_object` reads the key
for If-None-Match / If-Match, computes checksums, and only then stores the
new object, while werkzeug serves each connection on its own thread. Two
creates that arrive together can both succeed. That is a lock-free store,
which the probe exists to refuse, and it did: one CI run of `scripts/test`
saw "2 of 8 concurrent creates succeeded" in the probe's create race
(docs/stores.md). Real S3 is atomic; the tests want an S3 API that is too,
so this launcher runs moto's own application with one lock around each
request. Connections stay threaded (and HTTP/1.1 keep-alive), only the
handling is one at a time.

Usage: moto-server.py HOST PORT [--racy-window-ms N]

With --racy-window-ms the lock is left out and moto sleeps N ms between its
condition check and the store, so the race that moto has anyway is wide
enough to hit every time. The test command starts one such server as a real
lock-free S3 API that the probe must refuse (tests/cli.rs).
"""

import signal
import sys
import threading
import time

from werkzeug.serving import run_simple
from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    MotoRequestHandler,
    create_backend_app,
)


class Serialised:
    """WSGI middleware: the whole request, body read and response built,
    runs under one lock, so a condition check and the write it guards are
    never interleaved with another request's."""

    def __init__(self, app):
        self.app = app
        self.lock = threading.Lock()

    def __call__(self, environ, start_response):
        with self.lock:
            # Materialise the body under the lock: moto returns lists, but a
            # lazy iterable would otherwise run after the lock is released.
            return list(self.app(environ, start_response))


def widen_the_race(window_s):
    """Sleep inside moto's put_object between the If-None-Match / If-Match
    check and the write: `_get_checksum` is called exactly there."""
    from moto.s3 import responses

    checksum = responses.S3Response._get_checksum

    def slow(self, *args, **kwargs):
        time.sleep(window_s)
        return checksum(self, *args, **kwargs)

    responses.S3Response._get_checksum = slow


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    racy = None
    if len(sys.argv) == 5 and sys.argv[3] == "--racy-window-ms":
        racy = int(sys.argv[4]) / 1000.0
    elif len(sys.argv) != 3:
        sys.exit("usage: moto-server.py HOST PORT [--racy-window-ms N]")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    signal.signal(signal.SIGINT, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    if racy is not None:
        widen_the_race(racy)
    run_simple(
        host,
        port,
        app if racy is not None else Serialised(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
