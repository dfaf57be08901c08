"""Retry budgets: the worker's share of retries in flight, the caller's own retry count, and
the attempt loop consulting both (fake attempts, no sockets)."""

from __future__ import annotations

import gevent
import pytest

from app.core.config import Settings, SettingsError
from app.core.errors import UpstreamUnreachable
from app.observe.metrics import Metrics
from app.upstream.catalog import UpstreamSpec
from app.upstream.exchange import Upstream, UpstreamRequest
from app.upstream.retry import Deadline
from app.upstream.retry_budget import RetryBudget, caller_retry_count, gateway_retries
from app.upstream.transport import Transport


# -- the budget's accounting ---------------------------------------------------------------
def test_the_minimum_is_always_allowed_then_the_percent_of_requests_in_flight() -> None:
    budget = RetryBudget(percent=20, minimum=3)
    tickets = [budget.request() for _ in range(10)]
    granted = [t.retry() for t in tickets]
    # 10 in flight: 20 % is 2, the minimum 3 wins.
    assert granted == [True] * 3 + [False] * 7
    assert (budget.requests, budget.retries) == (10, 3)
    more = [budget.request() for _ in range(10)]  # 20 in flight: 20 % is 4
    assert [t.retry() for t in more] == [True] + [False] * 9
    assert budget.retries == 4


def test_the_share_is_never_rounded_up() -> None:
    budget = RetryBudget(percent=20, minimum=0)
    tickets = [budget.request() for _ in range(14)]  # 20 % of 14 is 2.8: two retries
    assert sum(t.retry() for t in tickets) == 2
    assert RetryBudget(percent=0, minimum=0).request().retry() is False


def test_a_hundred_percent_is_no_budget() -> None:
    budget = RetryBudget(percent=100, minimum=0)
    tickets = [budget.request() for _ in range(50)]
    assert all(t.retry() for t in tickets)
    assert all(t.retry() for t in tickets)  # each asks again: its own slot came back first


def test_a_request_holds_one_retry_at_a_time_and_gives_everything_back() -> None:
    budget = RetryBudget(percent=0, minimum=1)
    with budget.request() as first:
        assert first.retry() and first.retry() and first.retry()  # its own slot, reused
        assert budget.retries == 1
        with budget.request() as second:
            assert not second.retry()  # the one slot is taken
            assert budget.requests == 2
        assert (budget.requests, budget.retries) == (1, 1)
    assert (budget.requests, budget.retries) == (0, 0)
    with budget.request() as third:
        assert third.retry()  # freed by the first's end


def test_a_ticket_is_given_back_when_the_block_raises_and_only_once() -> None:
    budget = RetryBudget(percent=0, minimum=2)
    with pytest.raises(KeyError), budget.request() as ticket:
        ticket.retry()
        raise KeyError("boom")
    assert (budget.requests, budget.retries) == (0, 0)
    ticket.close()
    assert (budget.requests, budget.retries) == (0, 0)
    with pytest.raises(RuntimeError):
        ticket.retry()


@pytest.mark.parametrize(("percent", "minimum"), [(-1, 3), (101, 3), (20, -1)])
def test_a_budget_out_of_range_is_refused(percent: float, minimum: int) -> None:
    with pytest.raises(ValueError):
        RetryBudget(percent, minimum)
    env = {"LLMGATE_RETRY_BUDGET_PERCENT": str(percent), "LLMGATE_RETRY_BUDGET_MIN": str(minimum)}
    with pytest.raises(SettingsError, match="LLMGATE_RETRY_BUDGET"):
        Settings.from_env(env)


def test_the_settings_defaults() -> None:
    settings = Settings.from_env({})
    assert (settings.retry_budget_percent, settings.retry_budget_min) == (20.0, 3)


# -- the caller's own retries --------------------------------------------------------------
@pytest.mark.parametrize(
    ("headers", "count"),
    [
        ({"X-Stainless-Retry-Count": "2"}, 2),
        ({"x-stainless-retry-count": " 0 "}, 0),
        ({"X-STAINLESS-RETRY-COUNT": "1"}, 1),
        ({}, None),
        ({"x-stainless-retry-count": ""}, None),
        ({"x-stainless-retry-count": "-1"}, None),
        ({"x-stainless-retry-count": "1.5"}, None),
        ({"x-stainless-retry-count": "two"}, None),
        ({"x-stainless-retry-count": "٣"}, None),  # a digit, but not ASCII
        ({"x-stainless-retry-count": "9999999"}, None),
        ({"x-stainless-read-timeout": "600"}, None),
    ],
)
def test_caller_retry_count(headers: dict[str, str], count: int | None) -> None:
    assert caller_retry_count(headers) == count


@pytest.mark.parametrize(
    ("configured", "count", "retries"),
    [(2, None, 2), (2, 0, 2), (2, 1, 1), (2, 2, 0), (2, 5, 0), (0, 0, 0), (4, 1, 3)],
)
def test_a_caller_already_retrying_gets_fewer_gateway_retries(
    configured: int, count: int | None, retries: int
) -> None:
    assert gateway_retries(configured, count) == retries


# -- the attempt loop consults them --------------------------------------------------------
A = UpstreamSpec("a", "http://a.test/v1")
B = UpstreamSpec("b", "http://b.test/v1")


class FakeRaw:
    def __init__(self, status: int, headers: dict[str, str] | None = None) -> None:
        self.status = status
        self.headers = headers if headers is not None else {"retry-after-ms": "10"}

    def close(self) -> None:
        pass

    def release_conn(self) -> None:
        pass


class FakeTransport(Transport):
    """Attempts answer from ``answers`` in turn, the last one repeating: a status, or an
    error to raise. Each attempt's upstream goes into ``calls``."""

    def __init__(self, answers, calls: list[str]) -> None:
        super().__init__(Settings())
        self.answers = list(answers)
        self.calls = calls

    def send(self, spec, req, deadline):
        self.calls.append(spec.name)
        answer = self.answers.pop(0) if len(self.answers) > 1 else self.answers[0]
        if isinstance(answer, BaseException):
            raise answer
        return answer if isinstance(answer, FakeRaw) else FakeRaw(answer)


class FakeUpstream(Upstream):
    """The attempt loop over a fake transport; ``calls`` names the upstream of each attempt."""

    def __init__(self, specs, answers, **kw) -> None:
        self.calls: list[str] = []
        super().__init__(**kw, specs=list(specs), metrics=Metrics(multiproc_dir=""),
                         transport=FakeTransport(answers, self.calls))  # fmt: skip


def _upstream(specs=(A,), answers=(), *, sleep=lambda s: None, **settings) -> FakeUpstream:
    return FakeUpstream(specs, answers, settings=Settings(**settings), sleep=sleep,
                        rand=lambda: 0.0)  # fmt: skip


def _req(**headers: str) -> UpstreamRequest:
    return UpstreamRequest("POST", "/chat/completions", "", headers, b"{}", stream=False)


def _exhausted(upstream: Upstream) -> float:
    assert upstream.metrics is not None
    return upstream.metrics.retry_budget_exhausted._value.get()


def test_with_room_the_loop_retries_as_before_and_gives_the_budget_back() -> None:
    upstream = _upstream(answers=[503, 503, 200])
    resp = upstream.attempts.open(_req(), Deadline.start(60))
    assert (resp.status, resp.attempts, upstream.calls) == (200, 3, ["a", "a", "a"])
    assert (upstream.budget.requests, upstream.budget.retries) == (0, 0)
    assert _exhausted(upstream) == 0


def test_a_spent_budget_returns_the_503_at_once_and_counts_it() -> None:
    upstream = _upstream(answers=[503], retry_budget_min=1, retry_budget_percent=0)
    held = upstream.budget.request()
    assert held.retry()  # another request holds the only retry
    resp = upstream.attempts.open(_req(), Deadline.start(60))
    assert (resp.status, resp.attempts, upstream.calls) == (503, 1, ["a"])
    assert _exhausted(upstream) == 1
    held.close()
    assert (upstream.budget.requests, upstream.budget.retries) == (0, 0)


def test_a_spent_budget_stops_a_failover_too() -> None:
    upstream = _upstream((A, B), answers=[503], retry_budget_min=0, retry_budget_percent=0)
    resp = upstream.attempts.open(_req(), Deadline.start(60))
    assert (resp.status, resp.attempts, resp.upstream, upstream.calls) == (503, 1, "a", ["a"])
    assert upstream.metrics is not None and upstream.metrics.failovers._value.get() == 0


def test_an_error_stopped_by_the_budget_stays_retryable_unless_the_gateway_retried() -> None:
    upstream = _upstream(answers=[UpstreamUnreachable("down")], retry_budget_min=0,
                         retry_budget_percent=0)  # fmt: skip
    with pytest.raises(UpstreamUnreachable) as caught:
        upstream.attempts.open(_req(), Deadline.start(60))
    assert caught.value.retryable and upstream.calls == ["a"]
    assert "x-should-retry" not in caught.value.response_headers()

    # Half of two requests in flight: our first retry fits; while it waits the other request
    # ends, half of one is no retry: the second is refused. The gateway retried, so it says no.
    upstream = _upstream(answers=[UpstreamUnreachable("down")], retry_budget_min=0,
                         retry_budget_percent=50)  # fmt: skip
    other = upstream.budget.request()
    upstream.attempts._sleep = lambda seconds: other.close()
    with pytest.raises(UpstreamUnreachable) as caught:
        upstream.attempts.open(_req(), Deadline.start(60))
    assert upstream.calls == ["a", "a"] and _exhausted(upstream) == 1
    assert caught.value.retryable is False
    assert caught.value.response_headers()["x-should-retry"] == "false"


def test_the_error_the_transport_raised_is_left_as_it_was_the_caller_gets_a_copy() -> None:
    """After the gateway's own retries the caller is told not to retry, on a copy raised
    from the transport's error: the error another stage raised (and may hold) is not
    changed on its way."""
    down = UpstreamUnreachable("down")
    upstream = _upstream(answers=[down], retries=1)
    with pytest.raises(UpstreamUnreachable) as caught:
        upstream.attempts.open(_req(), Deadline.start(60))
    assert upstream.calls == ["a", "a"]
    assert caught.value is not down and caught.value.__cause__ is down
    assert caught.value.retryable is False and caught.value.message == "down"
    assert down.retryable and "x-should-retry" not in down.response_headers()


def test_x_stainless_retry_count_cuts_the_gateway_retries() -> None:
    for count, attempts in (("2", 1), ("1", 2), ("0", 3), ("bad", 3)):
        upstream = _upstream(answers=[503])
        resp = upstream.attempts.open(
            _req(**{"X-Stainless-Retry-Count": count}), Deadline.start(60)
        )
        assert (resp.status, resp.attempts) == (503, attempts), count
        assert _exhausted(upstream) == 0
    # No failover either: moving is an attempt beyond the first too.
    upstream = _upstream((A, B), answers=[503])
    resp = upstream.attempts.open(_req(**{"x-stainless-retry-count": "2"}), Deadline.start(60))
    assert upstream.calls == ["a"] and resp.attempts == 1


def test_a_call_killed_in_its_backoff_gives_the_budget_back() -> None:
    slow = FakeRaw(503, {"retry-after": "30"})
    upstream = _upstream(answers=[slow], sleep=gevent.sleep, retry_after_max_s=60)
    call = gevent.spawn(upstream.attempts.open, _req(), Deadline.start(600))
    gevent.sleep(0.05)
    assert (upstream.budget.requests, upstream.budget.retries) == (1, 1)  # sleeping its retry
    call.kill()
    assert call.dead
    assert (upstream.budget.requests, upstream.budget.retries) == (0, 0)


def test_a_hedge_backup_needs_room_in_the_budget_and_gives_its_ticket_back() -> None:
    upstream = _upstream((A, B), answers=[200], retry_budget_min=0, retry_budget_percent=0)
    assert upstream.attempts.open_backup(_req(), Deadline.start(60), B) is None
    assert upstream.calls == [] and _exhausted(upstream) == 1
    assert (upstream.budget.requests, upstream.budget.retries) == (0, 0)
    upstream = _upstream((A, B), answers=[200], retry_budget_min=1, retry_budget_percent=0)
    resp = upstream.attempts.open_backup(_req(), Deadline.start(60), B)
    assert resp is not None and (resp.upstream, upstream.calls) == ("b", ["b"])
    assert (upstream.budget.requests, upstream.budget.retries) == (0, 0)
