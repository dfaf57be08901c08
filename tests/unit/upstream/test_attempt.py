"""An upstream attempt's life as a table (app/upstream/attempt.py): every allowed move leads
where the table says and tells the breaker what it says, every other move is illegal and
changes nothing, and every life tells the breaker exactly once; the ledger accounts for an
answer once however often it is closed."""

from __future__ import annotations

from collections.abc import Callable, Iterator

import pytest

from app.core.config import Settings
from app.core.errors import UpstreamReset
from app.core.moves import IllegalMove
from app.observe.metrics import Metrics
from app.upstream import attempt as life
from app.upstream.attempt import LIFE, TELLS, Attempt
from app.upstream.breaker import BreakerPolicy
from app.upstream.ledger import Ledger
from app.upstream.outliers import CANCELLED, FAILED, OK
from app.upstream.transport import Transport

# Each move, made through the attempt's own method (a 2xx for ``answer``, a 503 for
# ``judge``), returning what its breaker hears.
MOVES: dict[str, Callable[[Attempt], str | None]] = {
    life.ANSWER: lambda a: a.answered(200),
    life.JUDGE: lambda a: a.answered(503),
    life.FAIL: Attempt.fail,
    life.CANCEL: Attempt.cancel,
    life.END: lambda a: a.body_ended(),
    life.BREAK: lambda a: a.broke("upstream_reset"),
    life.RELEASE: Attempt.release,
}
# A way to each state from ``sent``.
WAY = {
    life.SENT: [],
    life.READING: [life.ANSWER],
    life.READ: [life.ANSWER, life.END],
    life.JUDGED: [life.JUDGE],
    life.BROKEN: [life.ANSWER, life.BREAK],
    life.RELEASED: [life.ANSWER, life.RELEASE],
    life.FAILED: [life.FAIL],
    life.CANCELLED: [life.CANCEL],
}


def _at(state: str) -> Attempt:
    attempt = Attempt("a")
    for move in WAY[state]:
        MOVES[move](attempt)
    assert attempt.state == state
    return attempt


def test_the_table_and_the_ways_cover_every_state_and_move() -> None:
    assert set(WAY) == set(LIFE)
    assert {move for row in LIFE.values() for move in row} == set(MOVES)


@pytest.mark.parametrize(
    ("state", "move"), [(s, m) for s in LIFE for m in LIFE[s]], ids=lambda x: str(x)
)
def test_every_allowed_move_leads_where_the_table_says_and_tells_what_it_says(state, move) -> None:
    attempt = _at(state)
    told = MOVES[move](attempt)
    assert attempt.state == LIFE[state][move]
    expected = FAILED if (state, move) == (life.SENT, life.JUDGE) else TELLS.get((state, move))
    assert told == expected


@pytest.mark.parametrize(
    ("state", "move"),
    [(s, m) for s in LIFE for m in MOVES if m not in LIFE[s]],
    ids=lambda x: str(x),
)
def test_every_other_move_is_illegal_and_changes_nothing(state, move) -> None:
    attempt = _at(state)
    failure = attempt.failure
    with pytest.raises(IllegalMove, match=f"an upstream attempt cannot {move} when {state}"):
        MOVES[move](attempt)
    assert (attempt.state, attempt.failure) == (state, failure)


def test_the_moves_a_bug_would_make_are_illegal() -> None:
    released = _at(life.RELEASED)
    with pytest.raises(IllegalMove):
        released.release()  # released twice: counted free twice, its span ended twice
    failed = _at(life.FAILED)
    with pytest.raises(IllegalMove):
        failed.body_ended()  # an end after it failed (it had no answer)
    broken = _at(life.BROKEN)
    with pytest.raises(IllegalMove):
        broken.body_ended()  # read on after it broke
    with pytest.raises(IllegalMove):
        _at(life.READING).answered(200)  # a second answer
    with pytest.raises(IllegalMove):
        _at(life.JUDGED).fail()  # no answer, after one


def _lives(state: str = life.SENT, seen: tuple[str, ...] = ()) -> Iterator[list[tuple]]:
    """Every life from ``state`` to a final state, as its (state, move) steps, each state at
    most once but for the moves that stay where they are."""
    if not LIFE[state]:
        yield []
        return
    for move, to in LIFE[state].items():
        if to == state:
            continue  # a move that changes nothing tells nothing (asserted below)
        if to not in seen:
            for rest in _lives(to, (*seen, state)):
                yield [(state, move), *rest]


def test_every_life_tells_its_breaker_exactly_once() -> None:
    def tells(step: tuple[str, str]) -> bool:
        return step in TELLS or step == (life.SENT, life.JUDGE)

    lives = list(_lives())
    assert len(lives) == 7  # each way a 2xx can end (4), judged, failed, cancelled
    for steps in lives:
        assert sum(tells(step) for step in steps) == 1, steps
    assert all(
        (state, move) not in TELLS
        for state in LIFE
        for move, to in LIFE[state].items()
        if to == state
    )


def test_what_the_breaker_hears_of_a_2xx_depends_on_how_its_body_ended() -> None:
    read = _at(life.READ)
    assert read.release() == OK
    given_up = _at(life.READING)
    assert given_up.release() == CANCELLED
    cut = _at(life.READ)  # read to its end, but short of its route's end
    assert cut.broke("upstream_reset") == FAILED and cut.failure == "upstream_reset"
    assert cut.release() is None  # told already
    judged = _at(life.JUDGED)
    assert judged.broke("upstream_reset") is None and judged.failure is None


# -- the ledger tells what the attempt says, once -------------------------------------------
class Raw:
    status = 200
    headers: dict[str, str] = {}
    closed = False

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        pass


def test_the_ledger_accounts_for_an_answer_once_however_often_it_is_closed() -> None:
    metrics = Metrics(multiproc_dir="")
    transport = Transport(Settings(), metrics=metrics)
    ledger = Ledger(["a"], BreakerPolicy(), lambda: 0.0, transport, metrics)
    attempt = ledger.start("a")
    ledger.at_headers(attempt, 200)
    resp = ledger.answered(Raw(), 1, attempt, None)  # type: ignore[arg-type]
    assert transport.in_use == 1 and resp.upstream == "a"
    ledger.broken(resp, UpstreamReset("cut"))
    ledger.close(resp)
    ledger.close(resp)  # a second close does nothing
    counted = metrics.upstream_attempts.labels("a", FAILED)._value.get()
    assert (counted, transport.in_use, attempt.state, attempt.failure) == (
        1, 0, life.RELEASED, "upstream_reset",
    )  # fmt: skip
