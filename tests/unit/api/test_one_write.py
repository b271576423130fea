"""`OneWrite`: the writes of one event-loop turn leave as one, in order; a large one or a
close does not wait for the turn to end."""

from __future__ import annotations

import asyncio
from typing import Any

from inferq.api.one_write import FLUSH_BYTES, OneWrite


class Recorder:
    def __init__(self) -> None:
        self.sent: list[bytes] = []
        self.closed = False

    def write(self, data: bytes) -> None:
        assert not self.closed
        self.sent.append(data)

    def close(self) -> None:
        self.closed = True

    def write_eof(self) -> None:
        self.sent.append(b"<eof>")

    def abort(self) -> None:
        self.closed = True

    def get_extra_info(self, name: str) -> Any:
        return f"info:{name}"


def _one_write(t: Recorder) -> OneWrite:
    return OneWrite(t, asyncio.get_running_loop())  # type: ignore[arg-type]


async def test_writes_of_one_turn_are_sent_together_at_its_end() -> None:
    t = Recorder()
    w = _one_write(t)
    w.write(b"HTTP/1.1 200 OK\r\n\r\n")
    w.write(b"{}")
    assert t.sent == []  # held for the turn
    await asyncio.sleep(0)
    assert t.sent == [b"HTTP/1.1 200 OK\r\n\r\n{}"]
    w.write(b"next")  # a later turn: a send of its own
    await asyncio.sleep(0)
    assert t.sent == [b"HTTP/1.1 200 OK\r\n\r\n{}", b"next"]


async def test_a_write_reaching_the_bound_is_sent_at_once_and_in_order() -> None:
    t = Recorder()
    w = _one_write(t)
    w.write(b"head")
    w.write(b"x" * FLUSH_BYTES)
    assert t.sent == [b"head" + b"x" * FLUSH_BYTES]
    w.write(b"tail")
    await asyncio.sleep(0)
    assert t.sent[1:] == [b"tail"]


async def test_close_sends_what_it_holds_first() -> None:
    t = Recorder()
    w = _one_write(t)
    w.write(b"last words")
    w.close()
    assert t.sent == [b"last words"] and t.closed
    await asyncio.sleep(0)  # the turn's own flush finds nothing left
    assert t.sent == [b"last words"]


async def test_writelines_and_eof_keep_the_order_and_abort_drops_what_is_held() -> None:
    t = Recorder()
    w = _one_write(t)
    w.write(b"a")
    w.writelines([b"b", b"c"])
    w.write_eof()
    assert t.sent == [b"abc", b"<eof>"]
    w2 = _one_write(t2 := Recorder())
    w2.write(b"never sent")
    w2.abort()
    await asyncio.sleep(0)
    assert t2.sent == [] and t2.closed


async def test_everything_else_is_the_transport_s() -> None:
    assert _one_write(Recorder()).get_extra_info("peername") == "info:peername"
