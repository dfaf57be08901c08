"""bench/cpu/hit_cpu.py: the environ of a hit as gunicorn builds it, the summary (each side's
best round, its rounds and the collector's share; B over A), and the instruction counts."""

from __future__ import annotations

import json

from bench.cpu.hit_cpu import BODY, counted_lines, environ_for, instructions_in, summarize


def test_the_environ_is_the_request_nginx_sends_for_bench_abs_hit() -> None:
    body = json.dumps(BODY).encode()
    environ = environ_for(body)
    assert (environ["REQUEST_METHOD"], environ["PATH_INFO"]) == ("POST", "/v1/chat/completions")
    assert environ["CONTENT_LENGTH"] == str(len(body)) and environ["wsgi.input"].read() == body
    assert environ["HTTP_X_REQUEST_ID"] and environ["HTTP_X_FORWARDED_FOR"] == "127.0.0.1"
    assert BODY["temperature"] == 0  # deterministic: cached by the default cache mode


def test_the_summary_gives_each_sides_best_round_and_b_over_a() -> None:
    def run(*rounds: float, gc_us: float = 1.0) -> dict:
        return {"us": min(rounds), "rounds": list(rounds), "gc_us": gc_us, "gc_passes": 3}

    lines = summarize({"A": [run(210.0, 200.0), run(205.0)], "B": [run(190.0, gc_us=0.5)]})
    assert lines[0] == (
        "A             200.0 us/hit (best)  [210.0, 200.0, 205.0]  collector 1.0 us/hit"
    )
    assert lines[1].startswith("B             190.0 us/hit (best)  [190.0]")
    assert lines[2] == "B / A: 0.950 (-10.0 us/hit)"
    assert len(summarize({"working tree": [run(200.0)]})) == 1


def test_instructions_are_read_from_cachegrinds_summary_and_compared() -> None:
    report = "==15310== Collected : 4059731241\n==15310==\n==15310== I   refs:      4,059,731,241\n"
    assert instructions_in(report) == 4_059_731_241
    lines = counted_lines({"A": 1_410_000.0, "B": 1_382_000.0})
    assert lines[0] == "A              1410.0 thousand instructions/hit"
    assert lines[2] == "B / A: 0.980 (-28.0 thousand/hit)"
    assert counted_lines({"A": 2_074_300.0}, "call") == [
        "A              2074.3 thousand instructions/call"  # bench/cpu/call_cpu.py's unit
    ]
