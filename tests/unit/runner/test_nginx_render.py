"""The nginx template renders to a config nginx accepts, with values tied to the settings."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
from pathlib import Path

import pytest

from app.core.config import Settings
from app.core.errors import anthropic_body, anthropic_type
from runner.nginx import NginxParams, render_nginx
from tests.conftest import require_binary


def _params(**settings) -> NginxParams:
    return NginxParams.for_settings(
        Settings(**settings), listen="127.0.0.1:18080", app_servers=["127.0.0.1:18000"]
    )


def test_every_field_is_filled_and_limits_follow_the_settings() -> None:
    text = render_nginx(_params(max_body_bytes=1234, deadline_s=50, idle_timeout_s=700))
    assert "{{" not in text
    assert "client_max_body_size 1234;" in text
    # Above the largest gateway timeout (idle 700 s here), never nginx's default 60 s.
    assert "proxy_read_timeout 730000ms;" in text
    assert re.search(r"proxy_buffering off;", text)
    assert "proxy_http_version 1.1;" in text and 'proxy_set_header Connection "";' in text


def test_nginx_closes_idle_connections_to_gunicorn_before_gunicorn_would() -> None:
    """A server closing a kept connection while nginx sends a POST on it fails that call:
    nginx's idle timeout must end first, in service (gunicorn's keepalive) and in a drain."""
    from app.edge.worker import IDLE_CLOSE_AFTER_S
    from tests.conftest import ROOT

    text = render_nginx(_params())
    upstream_block = text[text.index("upstream llmgate_app") :].split("}", 1)[0]
    found = re.search(r"keepalive_timeout (\d+)s;", upstream_block)
    assert found is not None
    nginx_idle_s = int(found.group(1))
    gunicorn = re.search(r"^keepalive = (\d+)$", (ROOT / "gunicorn.conf.py").read_text(), re.M)
    assert gunicorn is not None
    assert nginx_idle_s < IDLE_CLOSE_AFTER_S < int(gunicorn.group(1))


def test_nginx_keeps_as_many_idle_connections_to_gunicorn_as_the_sizing_counts() -> None:
    """runner/sizing.py counts NGINX_KEEPALIVE idle connections per nginx worker, and it must
    be what the template says; at least 1,024, so a burst after a lull reuses them instead of
    waiting in gunicorn's accept queue (docs/performance.md, "The public method")."""
    from runner.sizing import NGINX_KEEPALIVE

    text = render_nginx(_params())
    upstream_block = text[text.index("upstream llmgate_app") :].split("}", 1)[0]
    found = re.search(r"^\s*keepalive (\d+);", upstream_block, re.M)
    assert found is not None and int(found.group(1)) == NGINX_KEEPALIVE >= 1024


def test_unknown_template_field_is_an_error() -> None:
    with pytest.raises(KeyError, match="nope"):
        render_nginx(_params(), template="x {{ nope }} y")


def test_rendered_config_passes_nginx_t(tmp_path: Path) -> None:
    binary = require_binary("nginx")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "logs").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(render_nginx(_params()))
    result = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


def test_a_drain_file_makes_nginx_answer_readyz_and_a_gone_gunicorn_itself(tmp_path: Path) -> None:
    """runner/drain.py: while the file exists, /readyz is nginx's 503 and a refused connect to
    gunicorn is a 503 gateway_shutdown (tests/integration/test_run_drain.py runs it)."""
    from app.core.errors import GatewayShutdown
    from runner.nginx import DRAINING_502, DRAINING_502_ANTHROPIC, DRAINING_READYZ

    plain = render_nginx(_params())
    assert "-f " not in plain and "location = /readyz" in plain
    drain = tmp_path / "run dir" / "draining"
    text = render_nginx(dataclasses.replace(_params(), drain_file=str(drain)))
    readyz = text[text.index("location = /readyz") :].split("}\n", 2)
    assert f'if (-f "{drain}") {{ return 503 \'{DRAINING_READYZ}' in "".join(readyz[:2])
    assert f'if (-f "{drain}") {{ return 503 \'{DRAINING_502}' in text
    # The status is the location's (the page's path ends with the door's: "anthropic/" or "").
    assert "error_page 502 = /_llmgate_error/${llmgate_error_door}502;" in text
    assert f'if (-f "{drain}") {{ return 503 \'{DRAINING_502_ANTHROPIC}' in text
    # The same words as the app's: its /readyz (app/edge/routes.py), its GatewayShutdown.
    assert json.loads(DRAINING_READYZ) == {"ready": False, "checks": {"draining": True}}
    shutdown = GatewayShutdown("The gateway instance is shutting down; retry the request.")
    assert json.loads(DRAINING_502) == json.loads(shutdown.to_json())
    assert json.loads(DRAINING_502_ANTHROPIC) == anthropic_body(503, shutdown.message)
    binary = require_binary("nginx")
    (tmp_path / "tmp").mkdir()
    (tmp_path / "logs").mkdir()
    conf = tmp_path / "nginx.conf"
    conf.write_text(text)
    result = subprocess.run(
        [binary, "-t", "-p", str(tmp_path), "-c", str(conf), "-e", "stderr"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


def _nginx_conf(**env: str) -> str:
    """What `make nginx-conf` prints (python -m runner.nginx) with ``env`` as the only
    LLMGATE_* settings."""
    import os
    import sys

    from tests.conftest import ROOT

    base = {k: v for k, v in os.environ.items() if not k.startswith("LLMGATE_")}
    done = subprocess.run(
        [sys.executable, "-m", "runner.nginx"],
        cwd=ROOT, env={**base, "PYTHONPATH": str(ROOT), **env},
        capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    return done.stdout


def _listening(text: str) -> tuple[list[str], list[str], list[str]]:
    """The config's listen lines, upstream servers and certificate lines."""
    listen = re.findall(r"^\s*listen (\S+)", text, re.M)
    servers = re.findall(r"^\s*server (\S+) max_fails", text, re.M)
    certs = re.findall(r"^\s*(ssl_certificate(?:_key)? \S+);", text, re.M)
    return listen, servers, certs


def test_nginx_conf_listens_and_proxies_where_the_settings_say(tmp_path: Path) -> None:
    text = _nginx_conf(
        LLMGATE_PORT="9090", LLMGATE_HOST="0.0.0.0", LLMGATE_TLS_PORT="9443",
        LLMGATE_BIND="0.0.0.0:9000,127.0.0.2:9001", LLMGATE_RUN_DIR=str(tmp_path),
    )  # fmt: skip
    listen, servers, certs = _listening(text)
    assert listen == ["0.0.0.0:9090", "0.0.0.0:9443"]
    assert servers == ["127.0.0.1:9000", "127.0.0.2:9001"]  # gunicorn's wildcard: loopback
    # No certificate given: the self-signed one `make run` keeps in its run directory.
    assert certs == [f"ssl_certificate {tmp_path}/tls/llmgate.crt",
                     f"ssl_certificate_key {tmp_path}/tls/llmgate.key"]  # fmt: skip
    given = _nginx_conf(LLMGATE_TLS_PORT="9443", LLMGATE_TLS_CERT="/etc/c.pem",
                        LLMGATE_TLS_KEY="/etc/k.pem")  # fmt: skip
    assert _listening(given)[2] == ["ssl_certificate /etc/c.pem", "ssl_certificate_key /etc/k.pem"]


def test_nginx_conf_defaults_are_make_runs() -> None:
    listen, servers, _ = _listening(_nginx_conf())
    assert listen == ["127.0.0.1:8080", "127.0.0.1:8443"] and servers == ["127.0.0.1:8000"]
    listen, _, certs = _listening(_nginx_conf(LLMGATE_TLS_PORT="0"))
    assert listen == ["127.0.0.1:8080"] and certs == []


def _pages(text: str) -> dict[str, tuple[int, dict]]:
    """Each error page's path under /_llmgate_error/ (e.g. "anthropic/413"): the status it
    returns and its body, parsed."""
    found = {}
    for path, block in re.findall(
        r"location = /_llmgate_error/(\S+) \{(.*?)(?:\}\n|\n            \})", text, re.S
    ):
        status, body = re.findall(r"return (\d+) '(.*)\\n';", block)[-1]
        found[path] = (int(status), json.loads(body))
    return found


def test_every_nginx_error_page_has_an_anthropic_twin_for_the_messages_door() -> None:
    """One page per status and door, or a status on /v1/messages would end on a missing
    location (an HTML 404); the Anthropic one typed as the app types that status there."""
    text = render_nginx(_params())
    assert re.search(
        r"map \$uri \$llmgate_error_door \{\s+~\^/v1/messages\(/\|\$\) anthropic/;", text
    )
    statuses = re.findall(
        r"error_page (\d+) (?:=\d* )?/_llmgate_error/\$\{llmgate_error_door\}(\d+);", text
    )
    assert len(statuses) == 15 and all(a == b for a, b in statuses)
    pages = _pages(text)
    for status, _ in statuses:
        openai, anthropic = pages[status], pages[f"anthropic/{status}"]
        assert openai[0] == anthropic[0]  # the same status (494 answers 431)
        assert set(openai[1]["error"]) == {"message", "type", "param", "code"}
        assert anthropic[1] == anthropic_body(
            anthropic[0], openai[1]["error"]["message"], anthropic_type(anthropic[0])
        ), status
