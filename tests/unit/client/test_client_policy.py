"""Pure client values: timeouts, deadlines, retry decisions, base URL and env, error mapping."""

from __future__ import annotations

import email.utils
import json

import pytest

from llmgate_client import errors
from llmgate_client.cli import percentile
from llmgate_client.config import parse_base_url, resolve_api_key, resolve_base_url
from llmgate_client.policy import Deadline, ResumePolicy, RetryPolicy, Timeout, retry_after
from tests.support.scripted_server import error_body

NOW = 1_000_000.0


class TestTimeout:
    def test_number_is_a_total_deadline_that_caps_the_others(self) -> None:
        assert Timeout.from_value(30) == Timeout(connect=5.0, read=30.0, total=30.0)
        assert Timeout.from_value(2) == Timeout(connect=2.0, read=2.0, total=2.0)

    def test_none_means_no_deadline_but_keeps_idle_and_connect(self) -> None:
        spec = Timeout.from_value(None)
        assert spec.total is None and spec.read == 120.0 and spec.connect == 5.0

    def test_value_passes_through_and_rejects_non_positive(self) -> None:
        spec = Timeout(connect=1, read=2, total=3)
        assert Timeout.from_value(spec) is spec
        with pytest.raises(ValueError):
            Timeout(total=0)


class TestDeadline:
    def test_remaining_cap_and_expiry(self) -> None:
        d = Deadline.after(10, NOW)
        assert d.remaining(NOW + 4) == 6
        assert d.cap(120, NOW + 4) == 6
        assert d.cap(2, NOW + 4) == 2
        assert d.cap(2, NOW + 11) == 0.001  # never zero: urllib3 rejects 0
        assert not d.expired(NOW + 9.9) and d.expired(NOW + 10)

    def test_no_deadline(self) -> None:
        d = Deadline.after(None, NOW)
        assert d.remaining(NOW) is None and d.cap(7, NOW) == 7 and not d.expired(NOW + 1e9)

    def test_earliest(self) -> None:
        a, b, none = Deadline(5), Deadline(3), Deadline(None)
        assert a.earliest(b) is b and b.earliest(a) is b
        assert none.earliest(a) is a and a.earliest(none) is a


class TestBackoff:
    def test_full_jitter_between_zero_and_the_exponential_ceiling(self) -> None:
        p = RetryPolicy(backoff_initial=0.5, backoff_max=8.0)
        assert p.backoff(1, 0.0) == 0.0
        assert p.backoff(1, 0.999) == pytest.approx(0.4995)
        assert p.backoff(3, 0.5) == pytest.approx(1.0)  # ceiling 2.0
        assert p.backoff(20, 0.999) == pytest.approx(7.992)  # capped at backoff_max

    @pytest.mark.parametrize("status", [429, 502, 503, 504])
    def test_retryable_statuses(self, status: int) -> None:
        delay = RetryPolicy().delay(attempt=1, status=status, headers={}, rand=0.5, now_epoch=NOW)
        assert delay == pytest.approx(0.25)

    @pytest.mark.parametrize("status", [400, 401, 404, 413, 500])
    def test_permanent_statuses_are_not_retried(self, status: int) -> None:
        assert (
            RetryPolicy().delay(attempt=1, status=status, headers={}, rand=0.5, now_epoch=NOW)
            is None
        )

    def test_connect_failure_is_retried(self) -> None:
        assert RetryPolicy().delay(attempt=1, status=None, headers={}, rand=0, now_epoch=NOW) == 0

    def test_max_retries(self) -> None:
        p = RetryPolicy(max_retries=2)
        assert p.delay(attempt=2, status=503, headers={}, rand=0, now_epoch=NOW) is not None
        assert p.delay(attempt=3, status=503, headers={}, rand=0, now_epoch=NOW) is None
        assert (
            RetryPolicy.from_value(0).delay(
                attempt=1, status=503, headers={}, rand=0, now_epoch=NOW
            )
            is None
        )

    def test_x_should_retry_wins_both_ways(self) -> None:
        p = RetryPolicy()
        no = {"x-should-retry": "false"}
        yes = {"x-should-retry": "true"}
        assert p.delay(attempt=1, status=503, headers=no, rand=0, now_epoch=NOW) is None
        assert p.delay(attempt=1, status=None, headers=no, rand=0, now_epoch=NOW) is None
        assert p.delay(attempt=1, status=500, headers=yes, rand=0, now_epoch=NOW) == 0

    def test_server_requested_wait(self) -> None:
        p = RetryPolicy(retry_after_max=60)
        both = {"retry-after-ms": "1500", "retry-after": "9"}
        assert p.delay(attempt=1, status=429, headers=both, rand=0.9, now_epoch=NOW) == 1.5
        secs = {"retry-after": "2"}
        assert p.delay(attempt=1, status=429, headers=secs, rand=0.9, now_epoch=NOW) == 2.0
        too_long = {"retry-after": "3600"}
        assert p.delay(attempt=1, status=429, headers=too_long, rand=0.9, now_epoch=NOW) is None

    def test_retry_after_forms(self) -> None:
        date = email.utils.formatdate(NOW + 30, usegmt=True)
        assert retry_after({"retry-after": date}, NOW) == pytest.approx(30, abs=1)
        assert retry_after({"retry-after": "0.25"}, NOW) == 0.25
        assert retry_after({"retry-after": "-3"}, NOW) == 0.0
        assert retry_after({"retry-after": "soon"}, NOW) is None
        assert retry_after({"retry-after-ms": "x", "retry-after": "1"}, NOW) == 1.0
        assert retry_after({}, NOW) is None


class TestResumePolicy:
    def test_the_first_reconnect_at_once_then_full_jitter(self) -> None:
        policy = ResumePolicy(attempts=5, backoff_initial=0.25, backoff_max=0.6)
        assert policy.delay(0, 0.99) == 0.0
        assert [policy.delay(n, 0.5) for n in (1, 2, 3, 4)] == [0.125, 0.25, 0.3, 0.3]
        assert policy.delay(3, 0.0) == 0.0

    def test_from_value_and_validation(self) -> None:
        assert ResumePolicy.from_value(True) == ResumePolicy()
        assert ResumePolicy.from_value(False) is None and ResumePolicy.from_value(None) is None
        custom = ResumePolicy(attempts=2)
        assert ResumePolicy.from_value(custom) is custom
        with pytest.raises(ValueError, match="resume=False"):
            ResumePolicy(attempts=0)


class TestBaseUrl:
    @pytest.mark.parametrize(
        ("given", "origin", "prefix"),
        [
            ("http://127.0.0.1:8080", "http://127.0.0.1:8080", "/v1"),
            ("http://127.0.0.1:8080/", "http://127.0.0.1:8080", "/v1"),
            ("http://127.0.0.1:8080/v1", "http://127.0.0.1:8080", "/v1"),
            ("http://127.0.0.1:8080/v1/", "http://127.0.0.1:8080", "/v1"),
            ("https://edge.example/llm", "https://edge.example", "/llm/v1"),
            ("https://edge.example/llm/v1", "https://edge.example", "/llm/v1"),
        ],
    )
    def test_with_or_without_v1(self, given: str, origin: str, prefix: str) -> None:
        endpoint = parse_base_url(given)
        assert (endpoint.origin, endpoint.prefix) == (origin, prefix)
        assert endpoint.url("chat/completions") == prefix + "/chat/completions"

    @pytest.mark.parametrize("bad", ["127.0.0.1:8080", "ftp://x", "http://x/v1?a=1"])
    def test_rejects(self, bad: str) -> None:
        with pytest.raises(ValueError):
            parse_base_url(bad)

    def test_resolution_order(self) -> None:
        env = {"LLMGATE_BASE_URL": "http://a", "OPENAI_BASE_URL": "http://b"}
        assert resolve_base_url("http://x", env) == "http://x"
        assert resolve_base_url(None, env) == "http://a"
        assert resolve_base_url(None, {"OPENAI_BASE_URL": "http://b"}) == "http://b"
        assert resolve_base_url(None, {}) == "http://127.0.0.1:8080"
        keys = {"LLMGATE_API_KEY": "k1", "OPENAI_API_KEY": "k2"}
        assert resolve_api_key(None, keys) == "k1"
        assert resolve_api_key(None, {"OPENAI_API_KEY": "k2"}) == "k2"
        assert resolve_api_key(None, {}) is None


class TestErrorMapping:
    def test_openai_body(self) -> None:
        body = json.dumps(error_body("slow down", "rate_limit_error", "rl")).encode()
        err = errors.from_response(429, body, {"x-request-id": "r1"}, attempts=3)
        assert isinstance(err, errors.RateLimitError)
        assert (err.status, err.type, err.code, err.message) == (
            429,
            "rate_limit_error",
            "rl",
            "slow down",
        )
        assert (err.request_id, err.attempts) == ("r1", 3)
        assert "request_id=r1" in str(err) and "attempts=3" in str(err)

    @pytest.mark.parametrize(
        ("status", "cls"),
        [
            (400, errors.BadRequestError),
            (401, errors.AuthenticationError),
            (404, errors.NotFoundError),
            (413, errors.RequestTooLargeError),
            (500, errors.InternalServerError),
            (502, errors.BadGatewayError),
            (503, errors.ServiceUnavailableError),
            (504, errors.GatewayTimeoutError),
            (599, errors.InternalServerError),
            (418, errors.APIStatusError),
        ],
    )
    def test_class_by_status(self, status: int, cls: type) -> None:
        err = errors.from_response(status, b"{}", {})
        assert type(err) is cls and err.status == status and err.message == f"HTTP {status}"

    def test_non_json_body_keeps_its_text(self) -> None:
        err = errors.from_response(502, b"<html>Bad Gateway</html>", {})
        assert isinstance(err, errors.BadGatewayError) and "Bad Gateway" in err.message

    def test_error_event(self) -> None:
        payload = {"error": {"message": "upstream died", "type": "upstream_error", "code": "x"}}
        err = errors.from_event(payload, request_id="r2", attempts=1)
        assert isinstance(err, errors.StreamError)
        assert (err.message, err.type, err.code, err.request_id) == (
            "upstream died",
            "upstream_error",
            "x",
            "r2",
        )
        assert errors.from_event({"choices": []}, request_id=None, attempts=1) is None

    def test_tree(self) -> None:
        assert issubclass(errors.DeadlineExceeded, errors.APITimeoutError)
        assert issubclass(errors.APITimeoutError, errors.APIConnectionError)
        assert issubclass(errors.IncompleteStreamError, errors.APIResponseError)
        for cls in (errors.APIConnectionError, errors.APIStatusError, errors.APIResponseError):
            assert issubclass(cls, errors.LLMGateError)


def test_percentile_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert percentile(values, 50) == 50 and percentile(values, 95) == 95
    assert percentile([3.0], 95) == 3.0 and percentile([], 50) is None
