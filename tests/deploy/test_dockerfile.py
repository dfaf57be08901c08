"""deploy/Dockerfile, read without a Docker daemon: it runs `make run`'s command as a
non-root user on a slim base, copies only files that exist, and sets only real settings."""

from __future__ import annotations

import re

from tests.conftest import ROOT
from tests.deploy.support import (
    dockerfile,
    documented_names,
    env_pairs,
    exec_form,
    make_recipe,
)


def _all(instruction: str) -> list[str]:
    return [args for word, args in dockerfile() if word == instruction]


def _one(instruction: str) -> str:
    found = _all(instruction)
    assert len(found) == 1, f"{instruction}: {found}"
    return found[0]


def container_command() -> list[str]:
    """What the container runs, ENTRYPOINT's init process left out."""
    entrypoint = exec_form(_one("ENTRYPOINT"))
    assert entrypoint[0].endswith("/tini") and entrypoint[1:] == ["--"], entrypoint
    return exec_form(_one("CMD"))


def test_the_container_runs_the_command_make_run_runs() -> None:
    (run,) = [c for c in make_recipe("run")]
    # `make run` is `.venv/bin/python -m runner`; the image's python is the venv's.
    assert run[0].endswith("python") and container_command()[0] == "python"
    assert container_command()[1:] == run[1:] == ["-m", "runner"]


def test_slim_python_base_and_a_non_root_user_before_the_command() -> None:
    base = _one("FROM")
    assert re.fullmatch(r"python:3\.\d+-slim(-\w+)?", base), base
    order = [word for word, _ in dockerfile()]
    user = _one("USER")
    assert user not in ("root", "0") and not user.startswith("0:"), user
    assert order.index("USER") < order.index("CMD")
    # The stop signal is the one the runner drains on (runner/__main__.py).
    assert _one("STOPSIGNAL") == "SIGTERM"


def test_every_copied_source_exists_and_the_runtime_files_are_copied() -> None:
    copied = []
    for args in _all("COPY"):
        *sources, _dest = args.split()
        for source in sources:
            assert not source.startswith("--"), "no COPY --from/--chown expected here"
            assert (ROOT / source).exists(), f"COPY {source}: no such file in the repository"
            copied.append(source.rstrip("/"))
    # What `python -m runner` reads at run time (runner/stack.py, runner/nginx.py), and the
    # wire package the gateway imports (app/__init__.py).
    needed = {
        "requirements.txt",
        "app",
        "llmgate_wire",
        "runner",
        "simulator",
        "nginx",
        "gunicorn.conf.py",
    }
    assert needed <= set(copied), needed - set(copied)
    install = " ".join(_all("RUN"))
    assert "-r requirements.txt" in install and "requirements-dev" not in install


def test_env_sets_only_documented_settings_and_exposes_their_ports() -> None:
    env: dict[str, str] = {}
    for args in _all("ENV"):
        env.update(env_pairs(args))
    ours = {k for k in env if k.startswith("LLMGATE_")}
    assert ours <= documented_names(), ours - documented_names()
    exposed = {int(p) for args in _all("EXPOSE") for p in args.split()}
    assert exposed == {int(env["LLMGATE_PORT"]), int(env["LLMGATE_BIND"].rsplit(":", 1)[1])}
    assert env["LLMGATE_HOST"] == "0.0.0.0"  # nginx reachable from outside the container


def test_the_build_context_leaves_out_the_venv_and_git() -> None:
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", ".run"} <= set(ignored)
