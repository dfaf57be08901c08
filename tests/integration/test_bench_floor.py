"""bench/floor/turns.py's measuring stick: the same stack with bench/floor/app.py in the gateway's
place relays the bench's calls (a floor that failed its calls would measure nothing)."""

from __future__ import annotations

import json

import pytest

from bench.floor import FLOOR_APP
from tests.support.bodies import chat


def test_the_floor_app_relays_a_stream_and_an_answer_in_the_gateways_place(make_stack) -> None:
    floor = make_stack(memcached=False, wsgi_app=FLOOR_APP, env={"LLMGATE_CACHE_MODE": "off"})
    floor.sim_reset()
    stream = floor.post("/v1/chat/completions", chat(True, max_tokens=5))
    assert stream.status == 200 and stream.data.endswith(b"data: [DONE]\n\n")
    whole = floor.post("/v1/chat/completions", chat(max_tokens=5))
    assert whole.status == 200 and json.loads(whole.data)["choices"]
    # The floor app answered, not the gateway (which times every answer it sends) ...
    assert "Server-Timing" not in stream.headers
    assert "Server-Timing" not in whole.headers
    # ... and the upstream saw both calls, counted by the simulator itself ...
    assert floor.sim_stats()["requests"] == 2
    # ... with the caller's headers: the simulator's controls work through it, as through
    # the gateway (without them the floor measured faster answers than the gateway's).
    failed = floor.post("/v1/chat/completions", chat(max_tokens=5), headers={"x-sim-fault": "503"})
    assert failed.status == 503
    # With the cache off (the overhead bench), a repeated call goes upstream again.
    assert floor.post("/v1/chat/completions", chat(max_tokens=5)).status == 200
    assert floor.sim_stats()["requests"] == 4


def test_with_the_cache_on_the_floor_app_answers_a_repeat_from_its_worker(make_stack) -> None:
    # The gateway's cache is on by default, and so is the floor app's keeping.
    floor = make_stack(memcached=False, workers=1, wsgi_app=FLOOR_APP)
    floor.sim_reset()
    for stream in (False, True):
        call = chat(stream, max_tokens=5, temperature=0)
        first = floor.post("/v1/chat/completions", call)
        again = floor.post("/v1/chat/completions", call)
        assert first.status == again.status == 200
        assert again.data == first.data and len(first.data) > 100
    # One upstream call for each shape (one worker: its dict holds both).
    assert floor.sim_stats()["requests"] == 2
    # A failed answer is not kept.
    for _ in range(2):
        failed = floor.post(
            "/v1/chat/completions", chat(max_tokens=3), headers={"x-sim-fault": "503"}
        )
        assert failed.status == 503
    assert floor.sim_stats()["requests"] == 4


@pytest.mark.parametrize("side", ["flask", "lane", "lane+headers"])
def test_the_floor_answers_alike_each_way_it_can_be_measured(make_stack, side) -> None:
    # bench/floor/layers.py's sides: the same relay through Flask's machinery or around it,
    # with http.client's header parser or the gateway's, the same answers (a whole one with
    # its length, not chunked).
    from bench.floor.layers import SIDES

    env = {"LLMGATE_CACHE_MODE": "off", **SIDES[side]}
    floor = make_stack(memcached=False, wsgi_app=FLOOR_APP, env=env)
    floor.sim_reset()
    stream = floor.post("/v1/chat/completions", chat(True, max_tokens=5))
    assert stream.status == 200 and stream.data.endswith(b"data: [DONE]\n\n")
    assert stream.headers["Content-Type"].startswith("text/event-stream")
    whole = floor.post("/v1/chat/completions", chat(max_tokens=5))
    assert whole.status == 200 and json.loads(whole.data)["choices"]
    assert whole.headers["Content-Length"] == str(len(whole.data))
    failed = floor.post("/v1/chat/completions", chat(max_tokens=5), headers={"x-sim-fault": "503"})
    assert failed.status == 503  # the caller's headers reach the simulator
    assert floor.sim_stats()["requests"] == 3
