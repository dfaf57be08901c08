"""Lives as tables of allowed moves: a state, and for each state the moves it allows and
where each leads. No I/O here.

An object whose life is a table (a flight, app/streams/flight.py; an upstream attempt,
app/upstream/attempt.py) keeps its state in one field, changed only by its own methods,
each of which looks its move up here first: a move the table does not list from the state
the object is in raises ``IllegalMove`` and changes nothing. So a second end, an event after
the end or an attempt accounted for twice is a bug that says where it is, not a state that
drifts. The tables are written out whole beside the object, one line per state, so its
whole life reads in one place (h11's connection states are the model).
"""

from __future__ import annotations

from collections.abc import Mapping

# Each state's allowed moves, and the state each leads to.
Table = Mapping[str, Mapping[str, str]]


class IllegalMove(Exception):
    """A move the object's table does not allow from its state: a bug in the code that made
    it, never an answer to a caller (the object is left as it was)."""

    def __init__(self, what: str, state: str, move: str) -> None:
        super().__init__(f"{what} cannot {move} when {state}")
        self.what, self.state, self.move = what, state, move


def after(table: Table, what: str, state: str, move: str) -> str:
    """The state ``move`` leads to from ``state`` in ``table``; IllegalMove when the table
    does not allow it (``what`` names the object in the message: "a flight", ...)."""
    try:
        return table[state][move]
    except KeyError:
        raise IllegalMove(what, state, move) from None


def checked(table: Table) -> Table:
    """``table`` as written, once every state a move leads to has a row of its own (a final
    state's row is empty): a table that sends a move nowhere fails at import, not in a call."""
    nowhere = {to for allowed in table.values() for to in allowed.values()} - set(table)
    if nowhere:
        raise ValueError(f"moves lead to states without a row: {sorted(nowhere)}")
    return table
