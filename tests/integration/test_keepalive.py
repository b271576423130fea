"""Idle keep-alive connections: the API keeps them longer than clients and proxies do.

A server that closes an idle connection races a client that is sending a request on it at
that moment; the request meets a reset (or, behind nginx, a 502 on a POST it will not
retry). uvicorn's own default closes after 5 s, shorter than httpx's pool (5 s), nginx's
upstream keepalive (60 s), Go's and Java's. INFERQ_KEEPALIVE_S (75 s) is passed to uvicorn.
"""

from __future__ import annotations

import http.client
import select
import socket
import time
from urllib.parse import urlsplit

from tests.integration.stack import Stack, wait_for


def _connect(base: str) -> http.client.HTTPConnection:
    url = urlsplit(base)
    return http.client.HTTPConnection(url.hostname or "127.0.0.1", url.port, timeout=10)


def _get(conn: http.client.HTTPConnection, path: str) -> int:
    conn.request("GET", path)
    resp = conn.getresponse()
    resp.read()
    return resp.status


def _closed_by_server(sock: socket.socket) -> bool:
    readable, _, _ = select.select([sock], [], [], 0)
    return bool(readable) and sock.recv(1, socket.MSG_PEEK) == b""


def test_a_connection_idle_for_10_s_is_still_served(stack: Stack) -> None:
    conn = _connect(stack.api())
    assert _get(conn, "/healthz") == 200
    sock = conn.sock
    # The idle time is what is under test: past uvicorn's 5 s default, under INFERQ_KEEPALIVE_S.
    time.sleep(10)
    assert not _closed_by_server(sock)
    conn.request("POST", "/v1/jobs", body=b'{"input": "after a pause"}',
                 headers={"Content-Type": "application/json"})  # fmt: skip
    resp = conn.getresponse()
    assert resp.status == 202, resp.read()
    resp.read()
    assert conn.sock is sock  # the same connection answered, no reconnect
    conn.close()


def test_the_keepalive_setting_reaches_the_server(stack: Stack) -> None:
    conn = _connect(stack.api(keepalive_s=1))
    assert _get(conn, "/healthz") == 200
    sock = conn.sock
    assert sock is not None
    wait_for(lambda: _closed_by_server(sock), 15, "the server to close the idle connection")
    conn.close()
