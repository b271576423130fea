"""How a call reaches Redis, and the one place where Redis failures become `QueueUnavailable`.

`unavailable` wraps every queue call: redis-py's errors (and the OS's) for "Redis cannot
serve us right now" leave it as `QueueUnavailable`. Commands are packed by hiredis without
redis-py's pass over each argument (`FastPacker`) and written without a task each
(`LeanConnection`). The clients themselves (timeouts, TLS, Sentinel, Cluster) are built in
`inferq.shared.redis_clients`.

One connection that carries every caller's commands at once (`Multiplexed`). redis-py gives
each command a pooled connection of its own: a checkout, a write, a read, a parse and a
release around every call, 46-68 µs of client CPU an EVALSHA here, 10-13 µs when the API's
`ScriptBatch` pipelines a turn's submits (`scripts/mux_cost.py`). Redis answers a
connection's commands in the order they came, so one connection can carry every caller's:
the commands asked for in one turn of the event loop leave in one write, hiredis parses
replies as they arrive, and each goes to its caller's future, in order: 24-26 µs an EVALSHA
alone, 2-5 µs with 8-32 callers. Only the queue's scripts go this way (`MuxScript`, made by
`register`): never a blocking read (it would hold every command behind it) and never
pub/sub. Only a plain client of one server over TCP has one (`MuxRedis`,
`INFERQ_REDIS_MULTIPLEX`); Sentinel, Cluster, TLS and Unix sockets keep redis-py's pools,
which follow failovers and slots. Failures keep redis-py's shapes, so `unavailable` reads
them as before: a lost connection fails every call on it with ConnectionError, and a call
that waits past the timeout fails them all with TimeoutError and drops the connection
(replies come in order: the oldest waiting that long means the connection, or the server,
is stuck). The next call connects again; `retries` calls (the API's one) go out once more on
the new connection, as redis-py's retry policy sends them. A cancelled caller only drops its
future: its reply still arrives and is discarded, so the connection keeps its place.
"""

from __future__ import annotations

import asyncio
import functools
from collections import deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, ParamSpec, TypeVar, cast

import hiredis
from redis._parsers.base import BaseParser
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import (
    ClusterDownError,
    MasterDownError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    SlotNotCoveredError,
    TryAgainError,
)
from redis.exceptions import ConnectionError as RedisConnectionError
from redis.exceptions import TimeoutError as RedisTimeoutError

from inferq.shared.errors import QueueUnavailable

#: What "Redis cannot serve us right now" looks like, in redis-py's types and the OS's:
#: unreachable or slow, still loading its AOF (BusyLoadingError is a ConnectionError), a
#: replica that refuses writes (READONLY, during a failover), a full Redis under noeviction
#: (OOM), a master marked down or a slot being moved (TRYAGAIN). Retrying later can succeed.
REDIS_DOWN: tuple[type[BaseException], ...] = (
    RedisConnectionError,
    RedisTimeoutError,
    ReadOnlyError,
    OutOfMemoryError,
    MasterDownError,
    TryAgainError,
    ClusterDownError,
    SlotNotCoveredError,  # no live node serves a slot (mid-failover)
    OSError,
)
# Redis before 7 reports a write refused inside a Lua script as a generic script error
# ("ERR Error running script ...: -OOM command not allowed ..."), which redis-py cannot type.
_REFUSALS_IN_SCRIPTS = ("OOM command not allowed", "READONLY", "MASTERDOWN", "TRYAGAIN")
# Refusals redis-py leaves as a plain ResponseError, by their error code: too few replicas
# for min-replicas-to-write, a failed RDB save under stop-writes-on-bgsave-error, a script
# running past its time limit, still loading, and OOM where it is not typed (a pipeline, a
# script on Redis 7). Each passes: retrying later can succeed.
_REFUSAL_CODES = ("NOREPLICAS", "MISCONF", "BUSY", "LOADING", "OOM", "READONLY", "MASTERDOWN")


# redis-py puts this before the server's reply when a command of a pipeline (or of a
# MULTI/EXEC) fails: "Command # 2 (SET k 1) of pipeline caused error: NOREPLICAS ...".
_PIPELINE_PREFIX = "Command # "
_PIPELINE_SEP = " of pipeline caused error: "


def server_reply(e: ResponseError) -> str:
    """The server's error reply inside `e`, without redis-py's pipeline annotation (applied
    once per pipeline that raised it, so possibly more than once)."""
    msg = str(e)
    while msg.startswith(_PIPELINE_PREFIX) and _PIPELINE_SEP in msg:
        msg = msg.split(_PIPELINE_SEP, 1)[1]
    return msg


def is_refusal(e: ResponseError) -> bool:
    """A Redis refusal that redis-py left as a plain ResponseError, from a single command, a
    pipeline or a script: one whose error code is in `_REFUSAL_CODES` (Redis 7 puts it first,
    scripts included), or one of `REDIS_DOWN`'s inside a script error (Redis 6.2)."""
    msg = server_reply(e)
    if msg.split(" ", 1)[0] in _REFUSAL_CODES:
        return True
    return "script" in msg and any(r in msg for r in (*_REFUSALS_IN_SCRIPTS, *_REFUSAL_CODES))


def as_str(value: bytes | str) -> str:
    """A reply value as text: clients here read bytes (no `decode_responses`), fakeredis and
    a few replies give str."""
    return value.decode() if isinstance(value, bytes) else value


RETRY_ON = (RedisConnectionError, RedisTimeoutError, ConnectionResetError, OSError)

P = ParamSpec("P")
T = TypeVar("T")


def torn_connection(e: BaseException) -> bool:
    """A write on a connection torn down under it, raised from inside redis-py's connection
    code rather than as a ConnectionError: uvloop's "the handler is closed" when the server
    closed the socket during the connect handshake, or `_writer` already None because another
    task disconnected the node's connections (a cluster client does, on a node failure).
    Seen when a cluster master is killed under load: a lost connection, not a bug of ours."""
    tb = e.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code.co_filename.replace("\\", "/").endswith(
            "redis/asyncio/connection.py"
        ):
            return isinstance(e, RuntimeError | AttributeError)
        tb = tb.tb_next
    return False


def unavailable(fn: Callable[P, Awaitable[T]]) -> Callable[P, Awaitable[T]]:
    """Wrap a broker call so every `REDIS_DOWN` failure leaves it as `QueueUnavailable`
    (cause attached): callers above the broker handle one error type, not redis-py's."""

    @functools.wraps(fn)
    async def wrapper(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return await fn(*args, **kwargs)
        except REDIS_DOWN as e:
            raise QueueUnavailable(f"redis unavailable: {type(e).__name__}: {e}") from e
        except (RuntimeError, AttributeError) as e:
            if not torn_connection(e):
                raise
            raise QueueUnavailable(f"redis unavailable: connection torn down: {e!r}") from e
        except ResponseError as e:
            if not is_refusal(e):
                raise
            raise QueueUnavailable(f"redis unavailable: {e}") from e

    return wrapper


#: Argument types packed as hiredis packs them, grown by `_learn`: exactly str, bytes and
#: int, and each str subclass met (the schema's StrEnum field names: a str either way). An
#: int subclass (bool, IntEnum) is never added, and goes the library's way.
_PLAIN: set[type] = {str, bytes, int}


def _learn(kinds: set[type]) -> bool:
    """Whether every type in `kinds` packs plainly, remembering the str subclasses."""
    if not all(issubclass(k, str) and not issubclass(k, int) for k in kinds - _PLAIN):
        return False
    _PLAIN.update(kinds)  # a set's update is atomic under the GIL: threads may share it
    return True


class FastPacker:
    """hiredis's command packer without redis-py's pass over each argument in Python
    (`HiredisRespSerializer`: two generator passes and an encoder call an argument, ~0.4 µs;
    a 48-argument FINISH packs in ~6 µs instead of ~25). Only commands whose arguments are
    all str (or a str enum), bytes or int take this way, which packs them to the same bytes (a
    test holds it); anything else (a float, a memoryview, a bool, an int enum, a two-word
    command name) goes the library's way, with its checks. The types are checked as one set
    (`map(type, ...)`, no Python call an argument)."""

    __slots__ = ("_library",)

    def __init__(self, library: Any) -> None:
        self._library = library

    def pack(self, *args: Any) -> list[bytes]:
        first = args[0]
        if type(first) is str and " " not in first:
            kinds = set(map(type, args))
            if kinds <= _PLAIN or _learn(kinds):
                return [hiredis.pack_command(args)]
        return cast(list[bytes], self._library.pack(*args))


class LeanConnection:
    """What `fast_packing` mixes into a pool's connection class (first in its MRO).

    `send_packed_command`: redis-py bounds each write by `socket_timeout` with
    `asyncio.wait_for`, which on Python 3.11 costs a task and a timer per command (~17.6 µs of
    CPU against ~6.2 for `asyncio.timeout`; docs/benchmarks.md) and, when the write is done by
    the time a cancel lands, returns instead of raising: a worker's cancelled loop went on
    reading past its stop, and took a job its successor then never saw
    (tests/integration/test_redis_writes.py). `asyncio.timeout` bounds the same write with
    neither. The library's method still does the write and its error
    handling; it only finds no timeout to apply."""

    socket_timeout: float | None
    is_connected: bool

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        packer = getattr(self, "_command_packer", None)
        if packer is not None:
            self._command_packer = FastPacker(packer)

    async def send_packed_command(self, command: Any, check_health: bool = True) -> None:
        timeout = self.socket_timeout
        if not timeout:
            return await super().send_packed_command(command, check_health)  # type: ignore[misc,no-any-return]
        # Connecting and the health check keep their own timeouts, as in the library.
        if not self.is_connected:
            await self.connect_check_health(check_health=False)  # type: ignore[attr-defined]
        if check_health:
            await self.check_health()  # type: ignore[attr-defined]
        self.socket_timeout = None  # one command at a time on a connection: no one else reads it
        try:
            async with asyncio.timeout(timeout):
                await super().send_packed_command(command, False)  # type: ignore[misc]
        except TimeoutError as e:  # only ours: the library turns the OS's into ConnectionError
            raise RedisTimeoutError("Timeout writing to socket") from e
        finally:
            self.socket_timeout = timeout


_LEAN_CLASSES: dict[type, type] = {}


_R = TypeVar("_R", bound=Redis)


def fast_packing(client: _R) -> _R:
    """`client`, its pool's connections packing commands with `FastPacker` (where redis-py
    packs with hiredis at all) and writing them without a task per command
    (`LeanConnection`); a cluster client's nodes keep redis-py's own."""
    pool = client.connection_pool
    base = pool.connection_class
    if base not in _LEAN_CLASSES:
        _LEAN_CLASSES[base] = type(base.__name__, (LeanConnection, base), {})
    pool.connection_class = _LEAN_CLASSES[base]
    return client


class _Link(asyncio.Protocol):
    """One connection: commands written in order, each reply to the oldest waiting future."""

    def __init__(self, timeout_s: float | None) -> None:
        self._timeout_s = timeout_s
        self._reader = hiredis.Reader()
        self._waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self._out: list[bytes] = []
        self._transport: asyncio.Transport | None = None
        self._timer: asyncio.TimerHandle | None = None
        self.lost: BaseException | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport  # type: ignore[assignment]

    def connection_lost(self, exc: Exception | None) -> None:
        reason = f"Error while reading from socket: {exc}" if exc else "Connection closed"
        self._fail(RedisConnectionError(reason))

    def data_received(self, data: bytes) -> None:
        self._reader.feed(data)
        while True:
            try:
                reply = self._reader.gets()
            except hiredis.ProtocolError as e:
                self._fail(RedisConnectionError(f"Protocol error: {e}"))
                return
            if reply is False:  # hiredis: not a whole reply yet
                return
            if not self._waiting:  # a reply nobody asked for: this connection cannot be trusted
                self._fail(RedisConnectionError(f"Unexpected reply: {reply!r:.100}"))
                return
            done, _ = self._waiting.popleft()
            if done.done():  # its caller was cancelled
                continue
            if isinstance(reply, hiredis.ReplyError):
                done.set_exception(BaseParser.parse_error(str(reply)))
            else:
                done.set_result(reply)

    def send(self, packed: bytes) -> asyncio.Future[Any]:
        if self.lost is not None:
            raise RedisConnectionError(str(self.lost))
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._waiting.append((done, loop.time()))
        self._out.append(packed)
        if len(self._out) == 1:  # the first of this turn: one write carries the turn's
            loop.call_soon(self._flush)
        if self._timer is None and self._timeout_s:
            self._timer = loop.call_later(self._timeout_s, self._check)
        return done

    def _flush(self) -> None:
        if self._transport is not None and self.lost is None and self._out:
            self._transport.writelines(self._out)
        self._out = []

    def _check(self) -> None:
        self._timer = None
        if not self._waiting or self.lost is not None or not self._timeout_s:
            return
        loop = asyncio.get_running_loop()
        late = loop.time() - self._waiting[0][1]
        if late >= self._timeout_s:
            self._fail(RedisTimeoutError("Timeout reading from socket"))
        else:
            self._timer = loop.call_later(self._timeout_s - late, self._check)

    def _fail(self, error: BaseException) -> None:
        """Every call on this connection fails with `error`; the connection is done."""
        if self.lost is None:
            self.lost = error
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        if self._transport is not None:
            self._transport.abort()
        while self._waiting:
            done, _ = self._waiting.popleft()
            if not done.done():
                done.set_exception(type(error)(str(error)))

    def close(self) -> None:
        self._fail(RedisConnectionError("Connection closed by the client"))


class Multiplexed:
    """`await mux.call(*command)`: its reply, over the one connection (made on first use).
    `drop_on_cancel`, for one caller's blocking reads: a cancelled call closes the connection,
    as redis-py's does, so the server gives up the read instead of delivering its entries to
    a caller that is gone (they would sit in the consumer's pending list)."""

    def __init__(
        self,
        host: str,
        port: int,
        *,
        hello: Sequence[tuple[Any, ...]] = (),
        timeout_s: float | None = None,
        connect_timeout_s: float | None = None,
        retries: int = 0,
        drop_on_cancel: bool = False,
    ) -> None:
        self.host, self.port = host, port
        self.timeout_s, self.connect_timeout_s = timeout_s, connect_timeout_s
        self.retries, self.drop_on_cancel = retries, drop_on_cancel
        self._hello = list(hello)  # AUTH, SELECT: sent first on each connection
        self._link: _Link | None = None
        self._connecting: asyncio.Lock | None = None

    @classmethod
    def of(
        cls, connection: dict[str, Any], *, retries: int, drop_on_cancel: bool = False
    ) -> Multiplexed:
        """For the server a redis-py pool's `connection_kwargs` describe: its credentials,
        database and timeouts."""
        hello: list[tuple[Any, ...]] = []
        user, password = connection.get("username"), connection.get("password")
        if password is not None:
            hello.append(("AUTH", user, password) if user else ("AUTH", password))
        if db := int(connection.get("db") or 0):
            hello.append(("SELECT", db))
        return cls(
            connection.get("host", "localhost"),
            int(connection.get("port", 6379)),
            hello=hello,
            timeout_s=connection.get("socket_timeout"),
            connect_timeout_s=connection.get("socket_connect_timeout"),
            retries=retries,
            drop_on_cancel=drop_on_cancel,
        )

    async def call(self, *command: Any) -> Any:
        packed = hiredis.pack_command(command)
        for attempt in range(self.retries + 1):
            try:
                link = self._link
                if link is None or link.lost is not None:
                    link = await self._connect()
                try:
                    return await link.send(packed)
                except asyncio.CancelledError:
                    if self.drop_on_cancel:
                        link.close()
                    raise
            except (RedisConnectionError, RedisTimeoutError):
                if attempt == self.retries:
                    raise
                await asyncio.sleep(0.02 * 2**attempt)
        raise AssertionError("unreachable")

    async def _connect(self) -> _Link:
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:  # one connect for every caller that found none
            if self._link is not None and self._link.lost is None:
                return self._link
            loop = asyncio.get_running_loop()
            link: _Link | None = None
            try:
                async with asyncio.timeout(self.connect_timeout_s):
                    _, link = await loop.create_connection(
                        lambda: _Link(self.timeout_s), self.host, self.port
                    )
                    for command in self._hello:  # a refusal raises redis-py's error for it
                        await link.send(hiredis.pack_command(command))
            except BaseException as e:
                if link is not None:
                    link.close()
                if isinstance(e, OSError):  # refused, unreachable, or the timeout
                    raise RedisConnectionError(
                        f"Error connecting to {self.host}:{self.port}: {e}"
                    ) from e
                raise
            self._link = link
            return link

    async def aclose(self) -> None:
        if self._link is not None:
            self._link.close()
            self._link = None


class MuxRedis(Redis):
    """A plain client that also holds a `Multiplexed` connection to its server (`mux`), for
    `register`'s scripts, and for a worker a second one (`reads`) for its queue reads, which
    block: on `mux` a BLOCK would hold up every script behind it. Closing the client closes
    them."""

    mux: Multiplexed | None = None
    reads: Multiplexed | None = None

    async def aclose(self, close_connection_pool: bool | None = None) -> None:
        await super().aclose(close_connection_pool)
        for link in (self.mux, self.reads):
            if link is not None:
                await link.aclose()


def multiplexed(client: MuxRedis, *, retries: int, reads: bool = False) -> MuxRedis:
    """`client` with a `mux` to the server its pool connects to (one server, plain TCP: the
    caller's to know), with its pool's credentials and timeouts; and `reads` if asked for
    (never retried: a read that reached the server delivered its entries)."""
    kwargs = client.connection_pool.connection_kwargs
    client.mux = Multiplexed.of(kwargs, retries=retries)
    client.reads = Multiplexed.of(kwargs, retries=0, drop_on_cancel=True) if reads else None
    return client


class MuxScript:
    """An `AsyncScript` whose lone calls go out on a `Multiplexed` connection: EVALSHA, and on
    NOSCRIPT (a restarted or flushed Redis) SCRIPT LOAD and once more. A call in a pipeline
    (`client=`), or with an argument hiredis would pack unlike redis-py, goes the script's
    own way."""

    def __init__(self, script: AsyncScript, mux: Multiplexed) -> None:
        self.library = script
        self.sha: str = script.sha
        self.script = script.script
        self.mux = mux

    async def __call__(
        self, keys: Sequence[Any] = (), args: Sequence[Any] = (), client: Any = None
    ) -> Any:
        kinds = set(map(type, keys)) | set(map(type, args))
        if client is not None or not (kinds <= _PLAIN or _learn(kinds)):
            return await self.library(keys=keys, args=args, client=client)
        command = ("EVALSHA", self.sha, len(keys), *keys, *args)
        try:
            return await self.mux.call(*command)
        except NoScriptError:
            await self.mux.call("SCRIPT", "LOAD", self.script)
            return await self.mux.call(*command)


def register(redis: Redis, source: str) -> AsyncScript | MuxScript:
    """`redis.register_script(source)`, on the client's `mux` where it has one."""
    script = redis.register_script(source)
    mux = getattr(redis, "mux", None)
    return MuxScript(script, mux) if isinstance(mux, Multiplexed) else script
