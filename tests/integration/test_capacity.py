"""Held streams through `make run`'s own stack: every one established, pinged, and ended.

The stack is built as `make run` builds it (``runner.__main__.options_from_env``: nginx and
gunicorn sized by runner/sizing.py from LLMGATE_WORKER_CONNECTIONS) with a 1 s heartbeat.
1,000 streams are held open at once from one selector thread (tests/support/held.py), silent
but for the gateway's pings until the simulator's first token at one common moment, then
each gets its tokens and [DONE]. Zero errors, every stream held at the same time, a ping in
every one. The 10,000-stream level is the capacity benchmark's (bench/load/capacity.py): it takes
a minute or more on 2 cores, too long here; 1,000 take about 20 s.
"""

from __future__ import annotations

import dataclasses
import os
import time

import pytest

from runner.__main__ import options_from_env, parse_args
from runner.stack import Stack
from tests.conftest import require_binary
from tests.support.calls import raw_chat_request
from tests.support.held import HOLD_BODY, HeldStreams, raise_fd_limit

STREAMS = int(os.environ.get("LLMGATE_TEST_HELD_STREAMS", "1000"))
HEARTBEAT_S = 1.0


@pytest.mark.slow
def test_make_runs_stack_holds_streams_with_heartbeats_and_no_error(runs_dir) -> None:
    require_binary("nginx")
    require_binary("memcached")
    raise_fd_limit(STREAMS + 1024)
    base = options_from_env(parse_args([]))
    options = dataclasses.replace(
        base,
        run_dir=runs_dir / "capacity",
        port=0,
        app_bind="",
        logs_to_stdout=False,
        env={**base.env, "LLMGATE_HEARTBEAT_S": str(HEARTBEAT_S)},
    )
    with Stack(options) as stack:
        assert stack.sizing is not None and stack.sizing.stream_capacity >= 10_000
        host, port = stack.url.removeprefix("http://").split(":")
        # Long enough to open them all on a busy machine, then three heartbeats held.
        release_in = 10 + STREAMS * 0.005
        headers = {"x-sim-ttft-ms": str(int(release_in * 1000)), "Connection": "close"}
        streams = HeldStreams(host, int(port), batch=1000)
        streams.add([raw_chat_request(host, HOLD_BODY, headers) for _ in range(STREAMS)])
        began = time.monotonic()
        streams.run(lambda: not streams.pending, began + release_in + 60)
        streams.finish("still open 60 s after the first tokens")
    errors = [s.error for s in streams.streams if s.error]
    assert not errors, f"{len(errors)} errors, e.g. {sorted(set(errors))[:5]}"
    assert streams.all_held_at and streams.all_held_at < began + release_in
    assert streams.peak_held == STREAMS
    assert all(s.done for s in streams.streams)
    # Held well over two heartbeats each: every stream got pings, none went silent long
    # (generous: the gateway pings after one heartbeat of silence; 4 allows a busy machine).
    assert min(s.pings for s in streams.streams) >= 2
    late = [s.max_gap for s in streams.streams if s.max_gap > 4 * HEARTBEAT_S]
    assert not late, f"{len(late)} streams went silent for up to {max(late):.1f} s"
