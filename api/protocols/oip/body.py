"""Bodies in flight on the Open Inference Protocol's routes: the per-process budget of request
bytes after decompression (`BodyBudget`, a `Hold` per request), inflating a compressed body
in bounded steps off the event loop (`inflate`), and splitting a body into its JSON header
and binary tensors (`split_body`). What the body says is `oip.parse_infer`'s.

A request holds its body against the budget from its first byte until its job is in Redis;
before inflating, all the body can inflate to. Past the budget: 429 + Retry-After (the bytes
are transient: other requests free them); past INFERQ_MAX_BODY_BYTES or `MAX_INFLATE_RATIO`
times its compressed size: 413.
"""

from __future__ import annotations

import threading
import zlib

from inferq.shared.errors import InputInvalid, InputTooLarge, Overloaded

# --- inflating: bounded steps, bounded ratio, bounded bytes in flight ---
#: Compressed bytes fed to the inflater per step: its leftover input (which it copies on
#: every call) stays this small, so inflating a large body is linear, not quadratic.
INFLATE_IN_BYTES = 64 * 1024
#: Inflated bytes per step: what one step reserves against the budget, and how far a bomb
#: gets past a limit before it is refused.
INFLATE_OUT_BYTES = 1024 * 1024
#: A body that inflates to more than this many times its compressed size is refused (413).
#: Tensors and JSON compress far less (float data 1-4×, JSON text 5-20×); a deflate bomb
#: reaches ~1000×. Measured past `RATIO_FLOOR_BYTES` only: small bodies inflate freely.
MAX_INFLATE_RATIO = 256
RATIO_FLOOR_BYTES = 1024 * 1024
#: The budget of request bytes in flight per API process, in INFERQ_MAX_BODY_BYTES: at the
#: default 32 MiB, 128 MiB of bodies being read, inflated, parsed or submitted at once. A body
#: is in flight for milliseconds (the wait for the result holds none of it), so this bounds
#: memory, not throughput, unless many large bodies arrive in the same instant.
BUDGET_BODIES = 4


class BodyBudget:
    """Request bytes in flight after decompression, per API process (thread-safe: bodies
    inflate in worker threads). A request takes a `Hold` and makes it cover what it holds:
    its body as it arrives, and before inflating, all the body can inflate to; the hold is
    released once the request no longer needs the bytes (its job is in Redis, or it was
    refused). Past the budget: `Overloaded` (429, Retry-After), as other requests free their
    bytes within milliseconds; one body past the whole budget: `InputTooLarge` (413)."""

    def __init__(self, capacity_bytes: int) -> None:
        self.capacity_bytes = capacity_bytes
        self.held_bytes = 0
        self.peak_bytes = 0  # the most ever held at once (≤ capacity_bytes: a test's check)
        self.refused = 0  # holds refused for want of room
        self._lock = threading.Lock()

    def hold(self) -> Hold:
        return Hold(self)

    def _cover(self, hold: Hold, total: int) -> None:
        with self._lock:
            if hold.closed:  # the request ended (its client left) while this inflated
                raise Overloaded("the request ended while its body inflated", 1, "body_budget")
            more = total - hold.bytes
            if more <= 0:
                return
            if total > self.capacity_bytes:
                raise InputTooLarge(
                    f"the body needs {total} bytes, more than the API's whole budget of bytes "
                    f"in flight ({self.capacity_bytes}, {BUDGET_BODIES} × INFERQ_MAX_BODY_BYTES)"
                )
            if self.held_bytes + more > self.capacity_bytes:
                self.refused += 1
                raise Overloaded(
                    f"the API holds {self.held_bytes} bytes of request bodies in flight; this "
                    f"one's {total} would pass its budget of {self.capacity_bytes} "
                    f"({BUDGET_BODIES} × INFERQ_MAX_BODY_BYTES): retry",
                    1,
                    "body_budget",
                )
            hold.bytes = total
            self.held_bytes += more
            self.peak_bytes = max(self.peak_bytes, self.held_bytes)

    def _release(self, hold: Hold) -> None:
        with self._lock:
            if not hold.closed:
                hold.closed = True
                self.held_bytes -= hold.bytes


class Hold:
    """One request's bytes against a `BodyBudget`; a context manager that releases them."""

    def __init__(self, budget: BodyBudget) -> None:
        self.budget = budget
        self.bytes = 0
        self.closed = False

    def cover(self, total: int) -> None:
        """Hold at least `total` bytes in all (`Overloaded` / `InputTooLarge` if it cannot)."""
        self.budget._cover(self, total)

    def release(self) -> None:
        self.budget._release(self)

    def __enter__(self) -> Hold:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


_WBITS = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}


def inflate(
    raw: bytes | bytearray, encoding: str, max_bytes: int, hold: Hold | None = None
) -> bytearray:
    """A request body sent with `Content-Encoding` (gzip or deflate), at most `max_bytes`
    once inflated and at most `MAX_INFLATE_RATIO` times its compressed size (413 past
    either: a small body must not become a large one unchecked). Before inflating, `hold`
    covers the body and what it may inflate to (gzip's trailer says; deflate's bound is the
    limits'); then it inflates in steps of `INFLATE_OUT_BYTES`. CPU-bound: call it in a
    thread."""
    name = encoding.strip().lower()
    if name not in _WBITS:
        raise InputInvalid(f"Content-Encoding {encoding[:32]!r}; use gzip or deflate, or none")
    # Reserved before inflating: what gzip's trailer says it inflates to, else the most the
    # limits let it (deflate says nothing).
    bound = min(max_bytes, max(RATIO_FLOOR_BYTES, MAX_INFLATE_RATIO * len(raw)))
    declared = _gzip_size(raw) if name == "gzip" else None
    expected = bound if declared is None else min(declared, bound)
    if hold is not None:
        hold.cover(len(raw) + expected)
    inflater = zlib.decompressobj(_WBITS[name])
    source = memoryview(raw)
    out = bytearray()  # grown as it inflates (a bomb is refused before it takes much)
    size = fed = 0
    try:
        while not inflater.eof:
            if inflater.unconsumed_tail:
                data: bytes | memoryview = inflater.unconsumed_tail
            elif fed < len(source):
                data = source[fed : fed + INFLATE_IN_BYTES]
                fed += len(data)
            else:
                break  # all fed, and no end of stream: truncated
            piece = inflater.decompress(data, INFLATE_OUT_BYTES)
            size += len(piece)
            _check_inflated(size, fed - len(inflater.unconsumed_tail), name, max_bytes)
            if hold is not None:  # more than the trailer said: covered as it comes
                hold.cover(len(raw) + size)
            out += piece
    except zlib.error as e:
        raise InputInvalid(f"the body does not inflate as {name} ({e})") from e
    if not inflater.eof:
        raise InputInvalid(f"the body is a truncated {name} stream")
    return out


def _gzip_size(raw: bytes | bytearray) -> int | None:
    """What a gzip stream's trailer says it inflates to (ISIZE: mod 2**32, the last
    member's only, garbage if truncated: a hint to reserve and allocate by, no more)."""
    if len(raw) < 18:  # a header and a trailer
        return None
    return int.from_bytes(raw[-4:], "little")


def _check_inflated(size: int, consumed: int, encoding: str, max_bytes: int) -> None:
    if size > max_bytes:
        raise InputTooLarge(
            f"the body inflates past INFERQ_MAX_BODY_BYTES={max_bytes} bytes ({encoding})"
        )
    if size > RATIO_FLOOR_BYTES and size > MAX_INFLATE_RATIO * max(consumed, 1):
        raise InputTooLarge(
            f"the body inflates more than {MAX_INFLATE_RATIO}:1 ({consumed} {encoding} bytes "
            f"make {size} or more): refused as a compression bomb; send it uncompressed"
        )


def split_body(
    raw: bytes | bytearray, header_length: str | None
) -> tuple[bytes | bytearray, memoryview]:
    """(JSON header, binary data) of a body, by its `Inference-Header-Content-Length`."""
    if header_length is None:
        return raw, memoryview(b"")
    try:
        n = int(header_length)
    except ValueError:
        n = -1
    if not 0 <= n <= len(raw):
        raise InputInvalid(
            f"Inference-Header-Content-Length {header_length[:32]!r} is not a length within "
            f"the body's {len(raw)} bytes"
        )
    return raw[:n], memoryview(raw)[n:]
