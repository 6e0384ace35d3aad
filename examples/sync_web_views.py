"""Sync web views (the way Flask and Django views are written) sharing one async
HTTP client, owned by a background ``LoopThread``.

A WSGI server runs each request on one of 16 worker threads (as gunicorn's
``--threads 16`` or a Django/Flask development server with threading does).
Every view calls the same ``httpx.AsyncClient`` through loopbridge's blocking
face: the client, its connection pool and every request run on the one loop
that owns them, and the calling worker thread only blocks.  No event loop per
request, no client per request, no "attached to a different loop".

Lifecycle, in the order that leaks nothing:

1. start-up (Django ``AppConfig.ready()``, Flask ``create_app()``): start the
   loop thread, make the client on it;
2. requests: views call ``upstream.get_json(...)`` from any worker thread;
3. shutdown: stop accepting requests, let the workers finish, close the client
   *on its loop* (its connections close there), and stop the loop last.

Run it against any HTTP service that answers ``GET /json/<n>`` with JSON::

    python examples/sync_web_views.py http://127.0.0.1:8000 8080
"""

from __future__ import annotations

import json
import sys
import threading
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

import httpx

from loopbridge import LoopThread, adopt, blocking, proxy


class Upstream:
    """One async client for the whole process, usable from any thread."""

    def __init__(self, base_url: str, max_connections: int = 16) -> None:
        self.owner = LoopThread(name="upstream-client").start()
        limits = httpx.Limits(max_connections=max_connections)

        async def make() -> httpx.AsyncClient:
            return adopt(httpx.AsyncClient(base_url=base_url, limits=limits))

        self.client = proxy(self.owner.run(make))
        self._client = blocking(self.client)  # the face for worker threads

    def get_json(self, path: str) -> Any:
        response = self._client.get(path)
        response.raise_for_status()
        return response.json()

    def close(self) -> None:
        """Close the client on its loop, then stop the loop (it closes last)."""
        try:
            self._client.aclose()
        finally:
            self.owner.stop()


upstream: Upstream | None = None  # made at start-up, shared by every view


def view(environ: dict[str, Any], start_response: Callable[..., Any]) -> Iterable[bytes]:
    """A sync view: ``GET /item/<n>`` asks the upstream service for item n."""
    assert upstream is not None, "start() was not called"
    n = environ["PATH_INFO"].rsplit("/", 1)[-1]
    data = upstream.get_json(f"/json/{n}")
    body = json.dumps({"item": data, "worker": threading.current_thread().name}).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]


class PooledWSGIServer(WSGIServer):
    """A WSGI server that runs each request on a pool of worker threads."""

    workers = 16

    def server_activate(self) -> None:
        super().server_activate()
        self.pool = ThreadPoolExecutor(self.workers, thread_name_prefix="worker")

    def process_request(self, request: Any, client_address: Any) -> None:
        self.pool.submit(self._handle, request, client_address)

    def _handle(self, request: Any, client_address: Any) -> None:
        try:
            self.finish_request(request, client_address)
        except Exception:
            self.handle_error(request, client_address)
        finally:
            self.shutdown_request(request)

    def server_close(self) -> None:
        super().server_close()
        self.pool.shutdown(wait=True)  # the requests in progress finish


class QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        pass


class App:
    """The web app: start-up, serving on a thread, shutdown in order."""

    def __init__(self, upstream_url: str, host: str = "127.0.0.1", port: int = 0) -> None:
        global upstream
        upstream = self.upstream = Upstream(upstream_url)
        self.server = make_server(
            host, port, view, server_class=PooledWSGIServer, handler_class=QuietHandler
        )
        self.url = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, name="wsgi-accept")
        self.stopped: list[str] = []  # what shut down, in order

    def start(self) -> App:
        self.thread.start()
        return self

    def stop(self) -> None:
        global upstream
        self.server.shutdown()  # no new requests
        self.thread.join()
        self.server.server_close()  # the workers finish what they have
        self.stopped.append("web server")
        self.upstream.close()  # connections close on the client's loop; then the loop
        self.stopped.append("client and its loop")
        upstream = None


if __name__ == "__main__":
    app = App(sys.argv[1], port=int(sys.argv[2]) if len(sys.argv) > 2 else 8080).start()
    print(f"serving on {app.url}/item/<n>; Ctrl-C stops", flush=True)
    try:
        threading.Event().wait()
    except KeyboardInterrupt:
        pass
    finally:
        app.stop()
