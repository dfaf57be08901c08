"""A flight's life (app/streams/flight.py) as a table of allowed moves. No I/O here.

    waiting ──head: a stream's───▶ streaming ──events──▶ streaming
     │  │                           │  │
     │  └──body: a whole one──▶ answered ◀──finish──┘  │
     │                                                 │
     ├──fail──────────────▶ failing ◀────────fail──────┤
     ├──stop: the drain───▶ stopping ◀───────stop──────┤
     └──cancel────────────▶ cancelling ◀─────cancel────┘

    answered ──settle──▶ complete      failing, stopping ──settle──▶ failed
    cancelling ──settle──▶ cancelled   (a stop leaves answered and failing as they are)

Who moves it: the producer, in the flight's greenlet (``head``, ``body``, ``events``,
``finish``, ``fail``: its own failure, raised or said); the last listener to leave an
unfinished flight (``cancel``), or the producer stopping with no end; the drain
(``stop``, app/streams/drain.py); and the flight's greenlet once the producer is done and
``on_done`` ran (``settle``: only then do listeners see the end or a whole body, so the
answer is stored before any caller has all of it).

Stopping and cancelling reach the producer as a kill its greenlet gets at its next switch,
so it may still publish what it had in hand before then: those two states take the
producer's moves (what it says then changes how a stopped flight settles, a finished answer
still being complete; a cancelled one stays cancelled). Everything else the table does not
list raises IllegalMove (app/core/moves.py): a second head, an event before the head or
after the end, a second end, anything once settled.

Its listeners see fewer states than it lives through (``SEEN``, ``Flight.state``): an end
reaches them only once the flight settled, so a flight that is answered, failing or
stopping still looks as it did before; a cancelled one is cancelled for them at once.
"""

from __future__ import annotations

from app.core.moves import checked

# What its listeners see (``Flight.state``).
WAITING, STREAMING, COMPLETE, FAILED, CANCELLED = (
    "waiting",
    "streaming",
    "complete",
    "failed",
    "cancelled",
)
# What only the flight knows: its producer ended (answered: a whole answer is in; failing:
# with an error) or was stopped or cancelled, and the listeners are not told yet.
ANSWERED, FAILING, STOPPING, CANCELLING = "answered", "failing", "stopping", "cancelling"

# The moves.
HEAD, BODY, EVENTS, FINISH, FAIL = "head", "body", "events", "finish", "fail"
STOP, CANCEL, SETTLE = "stop", "cancel", "settle"

# fmt: off
LIFE = checked({
    WAITING:    {HEAD: STREAMING, BODY: ANSWERED, FAIL: FAILING, STOP: STOPPING,
                 CANCEL: CANCELLING},
    STREAMING:  {EVENTS: STREAMING, FINISH: ANSWERED, FAIL: FAILING, STOP: STOPPING,
                 CANCEL: CANCELLING},
    ANSWERED:   {STOP: ANSWERED, SETTLE: COMPLETE},
    FAILING:    {STOP: FAILING, SETTLE: FAILED},
    STOPPING:   {HEAD: STOPPING, EVENTS: STOPPING, BODY: ANSWERED, FINISH: ANSWERED,
                 FAIL: FAILING, STOP: STOPPING, SETTLE: FAILED},
    CANCELLING: {HEAD: CANCELLING, EVENTS: CANCELLING, BODY: CANCELLING, FINISH: CANCELLING,
                 FAIL: CANCELLING, STOP: CANCELLING, SETTLE: CANCELLED},
    COMPLETE:   {},
    FAILED:     {},
    CANCELLED:  {},
})
# fmt: on

# The state its listeners see once it moved to each; the states it lacks leave what they
# saw as it was.
SEEN = {
    WAITING: WAITING,
    STREAMING: STREAMING,
    CANCELLING: CANCELLED,
    COMPLETE: COMPLETE,
    FAILED: FAILED,
    CANCELLED: CANCELLED,
}
SETTLED = frozenset({COMPLETE, FAILED, CANCELLED})  # on_done ran: the end is told
GIVEN_UP = frozenset({CANCELLING, CANCELLED})  # its listeners' waits end (ClientGone)
# Each state's facts, looked up once a move: what its listeners see (None: as before), and
# whether it is settled and given up.
FACTS = {state: (SEEN.get(state), state in SETTLED, state in GIVEN_UP) for state in LIFE}
WHOLE = frozenset({ANSWERED, COMPLETE})  # a whole answer is in
UNFINISHED = frozenset({WAITING, STREAMING})  # its producer has not ended: cancel it
