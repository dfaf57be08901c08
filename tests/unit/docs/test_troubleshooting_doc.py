"""docs/troubleshooting.md quotes what the code prints. Where a line can be made here it is
made by the code that prints it (the kernel and resolver warnings, the error bodies, the
reload refusals) and must appear in the page as it is; the others are held by their fixed
words, in the page and in the source that prints them. And every link inside the page
lands on one of its headings."""

from __future__ import annotations

import re
import socket

import pytest
import urllib3
from urllib3.exceptions import HTTPError

from app.core import errors
from app.core.config import WORKER_CONNECTIONS, Settings
from app.core.reasons import reason
from app.tenancy import keyring
from app.upstream import catalog as upstreams
from app.upstream import pools
from runner import limits, resolve
from runner.sizing import size_for
from tests.conftest import ROOT

PAGE = (ROOT / "docs" / "troubleshooting.md").read_text()


def _in_page(line: str) -> None:
    assert line in PAGE, f"docs/troubleshooting.md does not quote:\n{line}"


def test_every_link_inside_the_page_lands_on_a_heading() -> None:
    headings = re.findall(r"^#+ (.+)$", PAGE, re.M)
    slugs = {re.sub(r"[^\w\- ]", "", h.lower()).replace(" ", "-") for h in headings}
    links = re.findall(r"\]\(#([\w-]+)\)", PAGE)
    assert len(links) >= 10 and set(links) <= slugs, set(links) - slugs


def test_the_kernel_warning_is_the_one_make_run_prints() -> None:
    sizing = size_for(Settings(), WORKER_CONNECTIONS, 2, 2, 20_000)
    kernel = limits.Kernel(nofile_soft=20_000, nofile_hard=20_000)
    _in_page(f"llmgate: warning: {limits.warnings(kernel, sizing)[0]}")


def test_the_resolver_warning_is_the_one_make_run_prints() -> None:
    def fails(host: str, port: int) -> object:
        raise socket.gaierror(-2, "Name or service not known")

    (line,) = resolve.unresolved([("default", "api.openai.example", 443)], fails)
    _in_page(f"llmgate: warning: {line}")
    assert resolve.DOCS.startswith("docs/troubleshooting.md#")
    _in_page("Failed to resolve 'api.openai.example' ([Errno -2] Name or service not known)")


def test_the_unreachable_error_is_the_gateways_body() -> None:
    manager = urllib3.PoolManager(retries=False)
    manager.pool_classes_by_scheme = pools.pool_classes(None)
    try:
        manager.request("GET", "http://127.0.0.1:9/v1", timeout=2)
    except HTTPError as exc:
        if "refused" not in str(exc):
            pytest.skip(f"port 9 does not refuse here: {exc}")
        error = errors.UpstreamUnreachable(f"Upstream unreachable: {reason(exc)}.")
    finally:
        manager.clear()
    _in_page(error.to_json().decode())


def test_the_gateway_keys_refusals_are_the_keyrings() -> None:
    ring = keyring.load('[[keys]]\nname = "team-a"\nsha256 = "' + "0" * 64 + '"\n')
    for headers in ([], [("Authorization", "Bearer llmg-nope")]):
        with pytest.raises(errors.InvalidApiKey) as refused:
            ring.authenticate(headers, now=0.0)
        _in_page(refused.value.to_json().decode())


def test_the_reload_refusals_are_the_files_checks() -> None:
    text = '[[upstreams]]\nname = "sim"\nbase_url = "http://127.0.0.1:9/v1"\nnme = "x"\n'
    with pytest.raises(upstreams.ConfigError) as refused:
        upstreams.load(text, {}, path="/etc/llmgate/llmgate.toml")
    _in_page(f"llmgate: not reloaded: {refused.value}")
    assert 'f"llmgate: not reloaded: {exc}"' in (ROOT / "runner" / "__main__.py").read_text()
    bad = '[[keys]]\nname = "team-a"\nsha256 = "' + "0" * 64 + '"\n\n\n[[keys]\n'
    with pytest.raises(keyring.KeysFileError) as refused_keys:
        keyring.load(bad, path="/etc/llmgate-keys/keys.toml")
    _in_page(f"keys file not re-read, the keys in force stay: {refused_keys.value}")


# Lines whose values come from a running stack: their fixed words, in the page and where
# the code prints them.
FIXED = [
    ("port 8080 on 127.0.0.1 is in use; set LLMGATE_PORT", "runner/claims.py", "is in use{by}; "),
    ("is in use by another llmgate; set", "runner/claims.py", '" by another llmgate"'),
    (
        '"type": "permission_error", "param": "model", "code": "model_not_allowed"',
        "app/core/errors.py",
        'code = "model_not_allowed"',
    ),
    (
        "The key 'team-a' may not use the model 'gpt-4o'.",
        "app/tenancy/keyring.py",
        'f"The key {self.name!r} may not use the model {model!r}."',
    ),
    (
        "Rate limit reached for key 'team-a': 2 requests per minute.",
        "app/tenancy/access.py",
        'f"Rate limit reached for key {key.name!r}: "',
    ),
    (
        "This endpoint is not served to your address (LLMGATE_OPS_ALLOW).",
        "nginx/llmgate.conf.template",
        "This endpoint is not served to your address",
    ),
    (
        "This endpoint needs the operator token:",
        "app/edge/routes.py",
        "This endpoint needs the operator token:",
    ),
    ("The gateway is busy: this", "app/core/errors.py", '"The gateway is busy: this worker is at'),
    (
        "too many requests in progress. Retry after 1 s.",
        "nginx/llmgate.conf.template",
        "too many requests in progress. Retry after 1 s.",
    ),
    (
        "closed our connections (memcache unexpected close; restarted?); reconnecting",
        "app/store/memcached.py",
        '"memcached node %s closed our connections (%s; restarted?); reconnecting"',
    ),
    (
        "failed ([Errno 111] Connection refused); skipping it",
        "app/store/memcached.py",
        '"memcached node %s failed (%s); skipping it"',
    ),
    (
        "limit counters unreachable; limits fail open: calls pass uncounted",
        "app/tenancy/access.py",
        '"limit counters unreachable; limits fail %s"',
    ),
    (
        "memcached node 127.0.0.1:11211 is back",
        "app/store/memcached.py",
        '"memcached node %s is back"',
    ),
    (
        "Upstream timed out: connecting to the upstream took longer than",
        "app/core/errors.py",
        '"connect": "connecting to the upstream"',
    ),
    (
        "TLS with the upstream failed:",
        "app/upstream/transport.py",
        '"TLS with the upstream failed: ',
    ),
    ('"error":"Connection refused"', "app/edge/readiness.py", 'target["error"] = error'),
]


@pytest.mark.parametrize(("quoted", "source", "printed"), FIXED, ids=[f[0][:30] for f in FIXED])
def test_each_fixed_line_is_in_the_page_and_in_the_code(
    quoted: str, source: str, printed: str
) -> None:
    _in_page(quoted)
    assert printed in (ROOT / source).read_text(), f"{source} no longer prints {printed!r}"


def test_the_page_is_linked_from_the_readme() -> None:
    assert "(docs/troubleshooting.md)" in (ROOT / "README.md").read_text()
