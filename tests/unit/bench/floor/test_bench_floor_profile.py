"""bench/floor/profile.py's arithmetic: py-spy's raw lines shared out by the file of their
innermost frame."""

from __future__ import annotations

from pathlib import Path

from bench.floor.profile import area, own_by_area

VENV = "/work/.venv/lib/python3.11/site-packages"


def test_a_frame_is_named_by_its_file() -> None:
    # py-spy's names: relative to the project, a package or the standard library ...
    assert area("answer (app/edge/calls.py:61)") == "app/edge/calls.py"
    assert area("send (gevent/_socketcommon.py:700)") == "gevent/_socketcommon.py"
    assert area("read (http/client.py:466)") == "http/client.py"
    # ... else the path past site-packages; a native frame has none.
    assert area(f"send ({VENV}/gevent/_socketcommon.py:700)") == "gevent/_socketcommon.py"
    assert area("") == "(native)"


def test_samples_count_for_their_innermost_frame_only(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "run (app/gateway.py:1);answer (app/edge/calls.py:9) 7\n"
        "run (app/gateway.py:1) 3\n"
        "answer (app/edge/calls.py:9);send (gevent/x.py:2) 10\n"
        "not a sample line\n"
    )
    own, total = own_by_area(raw)
    assert total == 20
    assert own == {"app/edge/calls.py": 7, "app/gateway.py": 3, "gevent/x.py": 10}
