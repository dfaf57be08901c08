"""The cluster's nginx passes a call to another instance only when the first cannot have
started it: a POST that reached an instance is never sent to a second one.

A real nginx from nginx/llmgate.conf.template over two stand-in instances on loopback: one
reads each request and resets the connection (an instance dying mid-call), the other
answers. Their own request counts say how many times each call was sent. Passive health
checks are off (max_fails=0), so nginx keeps taking turns between the two instead of
skipping the one that failed.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import urllib3

from app.core.config import Settings
from runner.nginx import NginxParams, start_nginx
from runner.procs import free_port
from tests.conftest import require_binary
from tests.support.scripted_server import Exchange, LoopbackServer, Request, completion

CALLS = 6


def _resets(request: Request, exchange: Exchange) -> None:
    exchange.reset()  # the request was read whole: it may have started work


def _answers(request: Request, exchange: Exchange) -> None:
    exchange.respond(200, completion("ok"))


def test_a_post_an_instance_took_and_reset_is_not_sent_to_another(runs_dir: Path) -> None:
    require_binary("nginx")
    prefix = Path(tempfile.mkdtemp(prefix="nginx-next-", dir=runs_dir))
    prefix.chmod(0o755)  # nginx workers run as nobody when the tests run as root
    http = urllib3.PoolManager(retries=False)
    with LoopbackServer(_resets) as dying, LoopbackServer(_answers) as alive:
        servers = [f"127.0.0.1:{dying.port}", f"127.0.0.1:{alive.port}"]
        params = NginxParams.for_settings(
            Settings(), listen=f"127.0.0.1:{free_port()}", app_servers=servers,
            max_fails=0, worker_processes=1,
        )  # fmt: skip
        nginx = start_nginx(prefix, params, log_path=prefix / "nginx.log")
        try:
            url = f"http://{params.listen}"
            posts = [
                http.request("POST", url + "/v1/chat/completions", body=b'{"n": %d}' % n,
                             headers={"Content-Type": "application/json"})
                for n in range(CALLS)
            ]  # fmt: skip
            # The control: a GET that met the reset is passed on (it cannot have billed), so
            # this rig sees a call sent twice when nginx sends one twice.
            before = (dying.stats.requests, alive.stats.requests)
            gets = [http.request("GET", url + "/v1/models") for _ in range(4)]
        finally:
            nginx.stop()

    # Taking turns, the dying instance got some of the POSTs...
    assert 0 < dying.stats.paths.count("/v1/chat/completions") < CALLS
    # ...and each POST reached one instance only: those it took failed, 502 in our JSON.
    assert before[0] + before[1] == CALLS
    failed = [resp for resp in posts if resp.status != 200]
    assert len(failed) == before[0]
    for resp in failed:
        assert resp.status == 502
        assert json.loads(resp.data)["error"]["code"] == "gateway_unavailable"
    assert [resp.status for resp in gets] == [200] * 4
    dying_gets = dying.stats.requests - before[0]
    assert dying_gets >= 1 and alive.stats.requests - before[1] == 4
