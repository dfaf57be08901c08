"""One upstream attempt's life, from its request sent to its answer done with, as a table of
allowed moves. No I/O here.

    sent ──answer: a 2xx's headers──▶ reading ──its body's end──▶ read
     │                                  │  │                        │  │
     │                                  │  └──break──▶ broken ◀──break┘  │
     │                                  └────────release────────────────┴──▶ released
     ├──judge: any other status's headers──▶ judged ──release──▶ released
     ├──fail: no answer (a connect error, a timeout, a reset)──▶ failed
     └──cancel: given up by the gateway's side, or refused before sending──▶ cancelled

(``broken`` and ``judged`` are released too; a judged answer that is retried is dropped where
it is.) Its breaker hears each attempt once, at the move that judges it (``TELLS``): a 2xx
when it is done with, because a generation is in its body (``ok`` read to its end,
``cancelled`` given up before), or when it breaks (``failed``: reset, timed out, too large, a
stream cut short, even after its end was read); any other status at its headers
(app/upstream/outliers.py's ``result_at_status``); no answer at once. Every path from
``sent`` to a final state passes exactly one move that tells.

An ``Attempt`` changes only through its own methods, each of which looks its move up in
``LIFE`` first (app/core/moves.py: an illegal move raises ``IllegalMove`` and changes nothing);
those that judge it return what its breaker hears, which app/upstream/ledger.py tells it.
The moves are per attempt, not per read: a read only says when the body ended.
"""

from __future__ import annotations

from app.core.moves import after, checked
from app.upstream.outliers import CANCELLED, FAILED, OK, result_at_status

# Its states (``Attempt.state``). ``FAILED`` and ``CANCELLED`` are also what its breaker hears.
SENT, READING, READ, JUDGED, BROKEN, RELEASED = (
    "sent",
    "reading",
    "read",
    "judged",
    "broken",
    "released",
)
# Its moves.
ANSWER, JUDGE, FAIL, CANCEL, END, BREAK, RELEASE = (
    "answer",
    "judge",
    "fail",
    "cancel",
    "end",
    "break",
    "release",
)

LIFE = checked(
    {
        SENT: {ANSWER: READING, JUDGE: JUDGED, FAIL: FAILED, CANCEL: CANCELLED},
        READING: {END: READ, BREAK: BROKEN, RELEASE: RELEASED},
        READ: {BREAK: BROKEN, RELEASE: RELEASED},
        # Judged at its status: what its body does after says nothing more of the upstream.
        JUDGED: {END: JUDGED, BREAK: JUDGED, RELEASE: RELEASED},
        BROKEN: {RELEASE: RELEASED},
        FAILED: {},
        CANCELLED: {},
        RELEASED: {},
    }
)
# The states in which it holds its upstream's attention: a request sent and not answered, or an
# answer being read (a bounded load counts these: app/upstream/affinity.py). Once left, never
# entered again: no move leads back.
BUSY = frozenset({SENT, READING, READ, BROKEN})
# What its breaker hears at a move (``JUDGE``: what the status says); the other moves tell
# nothing.
TELLS = {
    (SENT, FAIL): FAILED,
    (SENT, CANCEL): CANCELLED,
    (READING, BREAK): FAILED,
    (READ, BREAK): FAILED,
    (READING, RELEASE): CANCELLED,
    (READ, RELEASE): OK,
}


class Attempt:
    """One attempt at the upstream named ``upstream``; ``probe``: it is its breaker's
    half-open probe (app/upstream/breaker.py), whose result decides the breaker."""

    __slots__ = ("connect_s", "failure", "probe", "state", "upstream")

    def __init__(self, upstream: str, probe: bool = False) -> None:
        self.upstream = upstream
        self.probe = probe
        self.state = SENT
        self.failure: str | None = None  # the error type its answer broke with (its span's)
        # Seconds it spent opening a new connection on its way (0.0: it reused one): a
        # fact, not a move (Server-Timing's connect stage, app/request/stages.py).
        self.connect_s = 0.0

    def _move(self, move: str) -> str | None:
        """Make ``move`` (IllegalMove when ``LIFE`` does not allow it); what its breaker
        hears of it, if anything."""
        before = self.state
        self.state = after(LIFE, "an upstream attempt", before, move)
        return TELLS.get((before, move))

    def connected(self, seconds: float) -> None:
        """It spent ``seconds`` opening its connection (0.0: it reused one)."""
        self.connect_s = seconds

    # -- before an answer ------------------------------------------------------------------
    def answered(self, status: int) -> str | None:
        """Its answer's headers are in: a 2xx is judged when it is done with (None), any
        other status now (what its breaker hears)."""
        result = result_at_status(status)
        self._move(ANSWER if result is None else JUDGE)
        return result

    def fail(self) -> str | None:
        """No answer: it could not connect, timed out or was reset before its headers."""
        return self._move(FAIL)

    def cancel(self) -> str | None:
        """No answer, and no verdict on the upstream: killed (its caller left, a hedge it
        lost) or refused before anything was sent."""
        return self._move(CANCEL)

    # -- its answer ------------------------------------------------------------------------
    def body_ended(self) -> None:
        """Its body was read to its end."""
        self._move(END)

    def broke(self, error_type: str) -> str | None:
        """What came after its headers cannot be relayed (``error_type``: why, for its
        span): a 2xx failed; any other status was judged already."""
        told = self._move(BREAK)
        if told is not None:
            self.failure = error_type
        return told

    def release(self) -> str | None:
        """Done with: its connection counted free, its span ended. Once."""
        return self._move(RELEASE)

    @property
    def released(self) -> bool:
        return self.state == RELEASED

    @property
    def busy(self) -> bool:
        """In flight at its upstream (``BUSY``): sent and not answered, or being read."""
        return self.state in BUSY
