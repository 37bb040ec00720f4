"""What a receiver cannot make the notifier do (real HTTP servers on 127.0.0.1): follow a
redirect (to another host, or to ``ftp://``) with the token and the signature, hold a
courier past its deadline by trickling its answer, or write raw text into the log."""

from __future__ import annotations

import logging
import socket
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from foreshock.notify.delivery import request
from foreshock.notify.targets import Target


class Server:
    """A receiver that answers each request with ``answer(handler)``; it keeps what came."""

    def __init__(self, answer) -> None:
        self.seen: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                outer.seen.append({"headers": dict(self.headers), "body": self.rfile.read(length)})
                answer(self)

            def log_message(self, *args) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_port}/in"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    made: list[Server] = []
    yield made
    for server in made:
        server.close()


def _redirect(location: str):
    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(307)
        handler.send_header("Location", location)
        handler.end_headers()

    return answer


@pytest.mark.parametrize("elsewhere", ["other-host", "ftp"])
def test_a_redirect_is_never_followed(servers, elsewhere) -> None:
    other = Server(lambda h: (h.send_response(200), h.end_headers()))
    servers.append(other)
    location = other.url if elsewhere == "other-host" else "ftp://127.0.0.1/x"
    first = Server(_redirect(location.replace("127.0.0.1", "localhost")))
    servers.append(first)
    target = Target("webhook", first.url, headers={"Authorization": "Bearer t0ken"}, secret="s")
    outcome = request(target, first.url, b"{}", timeout=5.0)
    assert not outcome.ok and not outcome.retry
    assert outcome.reason == "HTTP 307: a redirect, not followed"
    assert len(first.seen) == 1 and other.seen == []  # nothing reached the other host


def test_a_trickling_receiver_cannot_hold_a_try_past_its_deadline() -> None:
    """The server sends its status line a byte every 0.5 s (each read well within the
    socket timeout): the try still ends at its deadline, and says so."""
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    stop = threading.Event()

    def trickle() -> None:
        conn, _ = listener.accept()
        with conn:
            conn.recv(65536)
            for byte in b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n" * 10:
                if stop.is_set():
                    return
                try:
                    conn.sendall(bytes([byte]))
                except OSError:
                    return
                time.sleep(0.5)

    threading.Thread(target=trickle, daemon=True).start()
    url = f"http://127.0.0.1:{listener.getsockname()[1]}/in"
    tick = time.monotonic()
    outcome = request(Target("webhook", url), url, b"{}", timeout=2.0)
    took = time.monotonic() - tick
    stop.set()
    listener.close()
    assert not outcome.ok and outcome.retry
    assert outcome.reason == "no answer within the deadline"
    assert took < 4.0


def test_a_receivers_words_are_one_escaped_line_in_the_log(servers, caplog) -> None:
    body = b"bad request\n2026-12-05 12:00:00 INFO foreshock: all deliveries fine\x1b[2J"

    def answer(handler: BaseHTTPRequestHandler) -> None:
        handler.send_response(400)
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        handler.wfile.write(body)

    server = Server(answer)
    servers.append(server)
    from foreshock.notify.courier import Courier, Job

    courier = Courier(Target("webhook", server.url), timeout=5.0)
    caplog.set_level(logging.ERROR, logger="foreshock.notify")
    courier.submit(Job(server.url, b"{}", what="warning w1"))
    assert courier.wait_idle(10)
    courier.close()
    (line,) = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert "\n" not in line and "\x1b" not in line
    assert "bad request\\n2026-12-05 12:00:00 INFO foreshock" in line and "\\x1b[2J" in line
