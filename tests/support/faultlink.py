"""The fault proxy's settings and connections (tests/support/faultproxy.py runs the loop).

A link is one client connection: two sockets, two flows.
A flow carries one direction's bytes, ``src`` → ``dst``, through three stages:

    recv(src) → delay queue (latency; slow close) → out buffer
              → token bucket (bandwidth) and byte budget (reset after N) → send(dst)

Only the proxy's loop thread touches these objects. Nothing here blocks or sleeps: a flow
tells the loop when it next has work (``next_due``) and the loop sleeps in its selector until
then, so a throttled 10 MB body costs a few wake-ups per second, not a busy loop.
"""

from __future__ import annotations

import array
import collections
import contextlib
import fcntl
import socket
import struct
import termios
from dataclasses import dataclass, field, replace

PASS, LATENCY, STALL, RESET, DOWN = "pass", "latency", "stall", "reset", "down"
MODES = (PASS, LATENCY, STALL, RESET, DOWN)
FORWARDING = (PASS, LATENCY)  # the modes in which bytes pass and conditions apply
TO_TARGET, TO_CLIENT, TOTAL = "to_target", "to_client", "total"

_BURST_S = 0.02  # a bucket holds this much of its rate by default: sends come every ~20 ms


@dataclass(frozen=True)
class Conditions:
    """What one direction suffers while the proxy forwards (modes pass and latency)."""

    latency: float = 0.0  # seconds added to each chunk, counted from its own arrival
    rate: float | None = None  # bytes per second, through a token bucket
    burst: int | None = None  # the bucket's size in bytes; default: _BURST_S of the rate
    reset_after: int | None = None  # bytes passed on in this direction, then RST
    close_delay: float = 0.0  # extra seconds a FIN waits before it is passed on


@dataclass(frozen=True)
class Settings:
    mode: str = PASS
    to_target: Conditions = field(default_factory=Conditions)
    to_client: Conditions = field(default_factory=Conditions)
    reset_after_total: int | None = None
    # Extra seconds for a new link's first flight: the TCP handshake's round trip, which the
    # kernel completes on loopback before the proxy even accepts.
    connect_latency: float = 0.0

    def shaped(self, to_client: dict, to_target: dict, mode: str | None = None) -> Settings:
        """A copy with these fields of each direction's conditions (and the mode) changed."""
        return replace(
            self,
            mode=mode or self.mode,
            to_client=replace(self.to_client, **to_client),
            to_target=replace(self.to_target, **to_target),
        )

    def budgets(self) -> tuple[int | None, ...]:
        return (self.to_target.reset_after, self.to_client.reset_after, self.reset_after_total)


class Bucket:
    """A token bucket: ``rate`` bytes per second, at most ``size`` bytes at once."""

    def __init__(self, rate: float, size: int | None, now: float) -> None:
        self.rate = rate
        self.size = max(1, size if size is not None else int(rate * _BURST_S))
        self.tokens = float(self.size)
        self.stamp = now

    def _need(self, now: float, want: int) -> float:
        """Tokens still missing before ``min(want, size)`` bytes may go (0 when ready)."""
        self.tokens = min(self.size, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        return max(0.0, min(want, self.size) - self.tokens - 1e-6)  # float fuzz: no 1 µs spins

    def allowance(self, now: float, want: int) -> int:
        return 0 if self._need(now, want) else min(want, int(self.tokens + 1e-6))

    def due(self, now: float, want: int) -> float:
        return now + self._need(now, want) / self.rate

    def take(self, n: int) -> None:
        self.tokens -= n


def reset_socket(sock: socket.socket) -> None:
    """Close with RST instead of FIN."""
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    sock.close()


def unsent(sock: socket.socket) -> int:
    """Bytes in the socket's send queue that the peer has not acknowledged (Linux)."""
    buf = array.array("i", [0])
    try:
        fcntl.ioctl(sock.fileno(), termios.TIOCOUTQ, buf)
    except OSError:
        return 0
    return buf[0]


class Side:
    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.eof = False  # this socket sent FIN


class Flow:
    def __init__(self, name: str, src: Side, dst: Side, cond: Conditions, now: float) -> None:
        self.name, self.src, self.dst = name, src, dst
        # Chunks waiting for their delivery time, in arrival order; b"" marks src's FIN.
        self.delayed: collections.deque[tuple[float, bytes]] = collections.deque()
        self.delayed_bytes = 0
        self.out = bytearray()  # due, waiting for dst to be writable and the bucket to allow
        self.eof_queued = False  # src's FIN has entered the delay queue
        self.fin = False  # ... and left it: shut dst for writing once ``out`` is empty
        self.fin_sent = False
        self.passed = 0  # bytes sent to dst since the byte budget was last set
        self.sent_any = False  # bytes ever sent to dst
        self.cond = Conditions()
        self.bucket: Bucket | None = None
        self.set_conditions(cond, now)

    def set_conditions(self, cond: Conditions, now: float) -> None:
        if (cond.rate, cond.burst) != (self.cond.rate, self.cond.burst):
            self.bucket = Bucket(cond.rate, cond.burst, now) if cond.rate else None
        self.cond = cond  # a new latency applies to chunks that arrive from now on

    @property
    def queued(self) -> int:
        return self.delayed_bytes + len(self.out)

    def receive(self, data: bytes, now: float, extra: float = 0.0) -> None:
        self.delayed.append((now + self.cond.latency + extra, data))
        self.delayed_bytes += len(data)

    def receive_eof(self, now: float) -> None:
        self.delayed.append((now + self.cond.latency + self.cond.close_delay, b""))
        self.eof_queued = True

    def discard(self) -> None:
        """Drop what is in flight (entering stall); a FIN not yet passed on is held again."""
        self.delayed.clear()
        self.delayed_bytes = 0
        self.out.clear()
        self.eof_queued = self.fin
        self._maybe_shut()

    def advance(self, now: float) -> None:
        """Move the chunks that are due to ``out``; pass the FIN on after the last byte."""
        while self.delayed and self.delayed[0][0] <= now:
            _, data = self.delayed.popleft()
            self.delayed_bytes -= len(data)
            self.out += data
            self.fin = self.fin or not data
        self._maybe_shut()

    def can_send(self, now: float) -> bool:
        out = len(self.out)
        return out > 0 and (self.bucket is None or self.bucket.allowance(now, out) > 0)

    def next_due(self, now: float) -> float | None:
        dues = [self.delayed[0][0]] if self.delayed else []
        if self.out and self.bucket is not None and not self.can_send(now):
            dues.append(self.bucket.due(now, len(self.out)))
        return min(dues, default=None)

    def send(self, now: float, budget: int | None) -> None:
        n = len(self.out)
        if self.bucket is not None:
            n = self.bucket.allowance(now, n)
        if budget is not None:
            n = min(n, budget)
        if n <= 0:
            return
        with memoryview(self.out) as view, view[:n] as part:
            sent = self.dst.sock.send(part)
        del self.out[:sent]
        self.passed += sent
        self.sent_any = self.sent_any or sent > 0
        if self.bucket is not None:
            self.bucket.take(sent)
        self._maybe_shut()

    def _maybe_shut(self) -> None:
        if self.fin and not self.out and not self.fin_sent:
            self.fin_sent = True
            with contextlib.suppress(OSError):
                self.dst.sock.shutdown(socket.SHUT_WR)


class Link:
    """A client connection and, unless it was accepted during a stall, its target connection."""

    def __init__(
        self,
        client: socket.socket,
        target: socket.socket | None,
        to_target: Conditions,
        to_client: Conditions,
        now: float,
        connect_latency: float = 0.0,
    ) -> None:
        self.client = Side(client)
        self.connect_latency = connect_latency
        self.target = Side(target) if target is not None else None
        self.flows: list[Flow] = []
        if self.target is not None:
            self.flows = [
                Flow(TO_TARGET, self.client, self.target, to_target, now),
                Flow(TO_CLIENT, self.target, self.client, to_client, now),
            ]
        self.reset_by: float | None = None  # resetting: RST once drained, or at this time

    def extra_latency(self, flow: Flow) -> float:
        """What a chunk from the client waits on top of the latency: the handshake's round
        trip while nothing has reached the client yet. A client that writes first (TLS,
        HTTP) would have written this flight that much later, after its CPU work since
        connect() (reading certificates, say), so the two add up as they would."""
        if flow.name != TO_TARGET or self.connect_latency <= 0:
            return 0.0
        answered = any(f.sent_any for f in self.flows if f.name == TO_CLIENT)
        return 0.0 if answered else self.connect_latency

    @property
    def sides(self) -> list[Side]:
        return [self.client] if self.target is None else [self.client, self.target]

    def side_of(self, sock: object) -> Side:
        return self.client if sock is self.client.sock else self.target  # type: ignore[return-value]

    def flow_from(self, side: Side) -> Flow | None:
        return next((f for f in self.flows if f.src is side), None)

    def flow_to(self, side: Side) -> Flow | None:
        return next((f for f in self.flows if f.dst is side), None)

    def budget(self, flow: Flow, total: int | None) -> int | None:
        """Bytes ``flow`` may still pass on before the link is reset (None: no limit)."""
        limits = [total - sum(f.passed for f in self.flows)] if total is not None else []
        if flow.cond.reset_after is not None:
            limits.append(flow.cond.reset_after - flow.passed)
        return min(limits, default=None)

    def exhausted(self, total: int | None) -> bool:
        return any((b := self.budget(f, total)) is not None and b <= 0 for f in self.flows)

    def drained(self) -> bool:
        return all(unsent(side.sock) == 0 for side in self.sides)

    def done(self) -> bool:
        """Both FINs passed on and nothing left in flight (a stall-born link never is)."""
        return bool(self.flows) and all(
            f.src.eof and f.fin_sent and not f.delayed and not f.out for f in self.flows
        )

    def next_due(self, now: float, poll: float) -> float | None:
        if self.reset_by is not None:
            return now + poll
        return min((d for f in self.flows if (d := f.next_due(now)) is not None), default=None)
