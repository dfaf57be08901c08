"""`make run`'s HTTPS listener: rendered into nginx's one server with HTTP/2, or not at all."""

from __future__ import annotations

import re

import pytest

from app.core.config import Settings, SettingsError
from runner.nginx import NginxParams, render_nginx


def _conf(tls_listen: str = "", tls_cert: str = "", tls_key: str = "") -> str:
    params = NginxParams.for_settings(
        Settings(),
        listen="127.0.0.1:8080",
        app_servers=["127.0.0.1:8000"],
        tls_listen=tls_listen,
        tls_cert=tls_cert,
        tls_key=tls_key,
    )
    return render_nginx(params)


def test_the_https_listener_speaks_http2_with_the_given_certificate() -> None:
    conf = _conf(tls_listen="0.0.0.0:8443", tls_cert="/etc/c.pem", tls_key="/etc/k.pem")
    assert re.search(r"^\s*listen 0\.0\.0\.0:8443 ssl http2 reuseport backlog=4096;$", conf, re.M)
    assert "ssl_certificate /etc/c.pem;" in conf and "ssl_certificate_key /etc/k.pem;" in conf
    # The same server block: the plain listener, the routes and proxy_buffering off serve both.
    server = conf[conf.index("    server {") :]
    assert (
        server.index("listen 127.0.0.1:8080")
        < server.index("ssl http2")
        < server.index("proxy_buffering off;")
    )


def test_no_https_listener_without_a_port() -> None:
    conf = _conf()
    assert "ssl" not in re.sub(r"#.*", "", conf)


def test_a_certificate_needs_its_key_and_the_port_a_number() -> None:
    assert Settings.from_env({}).tls_port == 8443
    with pytest.raises(SettingsError, match="LLMGATE_TLS_CERT and LLMGATE_TLS_KEY"):
        Settings.from_env({"LLMGATE_TLS_CERT": "/c.pem"})
    with pytest.raises(SettingsError, match="LLMGATE_TLS_PORT"):
        Settings.from_env({"LLMGATE_TLS_PORT": "70000"})
