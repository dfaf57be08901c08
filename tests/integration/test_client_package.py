"""The client as its users get it: the llmgate-client wheel built from this checkout,
installed into a fresh venv, streaming a chat through the real stack (nginx → gunicorn gevent
workers → simulator) from a directory outside the checkout.

Neither the checkout nor the test's venv is on that venv's path, so an import the wheel cannot
satisfy (``app``, the simulator, a library the distribution does not declare) fails there as it
would for a user. pip builds the wheel from pyproject.toml (its backend, hatchling, comes from
PyPI, like urllib3 for the fresh venv); each step runs under a time limit.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import ROOT
from tests.support.stack import StackHandle

STEP_TIMEOUT_S = 240  # one pip or venv step; a cached run takes a few seconds
PIP = ["-m", "pip", "--disable-pip-version-check", "--no-input", "--timeout", "30"]
GATEWAY_ONLY = {"flask", "werkzeug", "gunicorn", "gevent", "pymemcache", "prometheus-client"}
MODEL = "sim/tokens=12,tps=400"
PROMPT = "What does a wheel hold?"
# Slow, whole: each test needs the wheel built and installed in a fresh venv (about 6 s).
pytestmark = pytest.mark.slow

# Run by the fresh venv's python from a directory outside the checkout: where the client was
# imported from, whether the gateway's package can be found at all, and the streamed deltas.
SCRIPT = """
import importlib.util
import json
import sys

import llmgate_client
from llmgate_client import Client

base_url, model, prompt = sys.argv[1:4]
with Client(base_url, "sk-wheel", timeout=30, retries=0) as llm:
    with llm.chat_stream(prompt, model=model) as stream:
        deltas = list(stream.text_deltas())
    print(json.dumps({
        "client_file": llmgate_client.__file__,
        "app_found": importlib.util.find_spec("app") is not None,
        "deltas": deltas,
        "finish_reason": stream.finish_reason,
    }))
"""


def _env() -> dict[str, str]:
    """The machine's environment (pip's own settings included) without anything that would
    put the checkout or another venv on the path."""
    drop = ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV", "PYTHONSTARTUP")
    env = {k: v for k, v in os.environ.items() if k not in drop}
    env = {k: v for k, v in env.items() if not k.startswith(("LLMGATE_", "OPENAI_"))}
    env["PYTHONNOUSERSITE"] = "1"
    return env


def _run(args: list[str], cwd: Path) -> str:
    proc = subprocess.run(
        args, cwd=cwd, env=_env(), capture_output=True, text=True, timeout=STEP_TIMEOUT_S
    )
    assert proc.returncode == 0, f"{args}\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}"
    return proc.stdout


@pytest.fixture(scope="module")
def venv_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A fresh venv with the client's wheel installed, and nothing else of ours."""
    work = tmp_path_factory.mktemp("client-package")
    assert not work.resolve().is_relative_to(ROOT.resolve())
    dist = work / "dist"
    _run([sys.executable, *PIP, "wheel", "--no-deps", "-w", str(dist), str(ROOT)], cwd=work)
    (wheel,) = dist.glob("llmgate_client-*.whl")
    _run([sys.executable, "-m", "venv", str(work / "venv")], cwd=work)
    python = work / "venv" / "bin" / "python"
    _run([str(python), *PIP, "install", str(wheel)], cwd=work)
    return python


def test_the_wheel_installs_only_the_client_and_its_dependencies(venv_python: Path) -> None:
    listed = json.loads(_run([str(venv_python), *PIP, "list", "--format=json"], venv_python.parent))
    installed = {entry["name"].lower().replace("_", "-") for entry in listed}
    assert not installed & GATEWAY_ONLY, installed & GATEWAY_ONLY
    # pip (and setuptools, on Python < 3.12) come with every venv.
    assert installed - {"pip", "setuptools"} == {"llmgate-client", "urllib3"}, installed


def test_the_installed_client_streams_a_chat_through_the_gateway(
    venv_python: Path, gw: StackHandle, tmp_path: Path
) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "stream_chat.py").write_text(SCRIPT)
    out = _run([str(venv_python), "stream_chat.py", gw.url + "/v1", MODEL, PROMPT], cwd=elsewhere)
    seen: dict[str, Any] = json.loads(out)
    # The client came from the venv, and the gateway's package is nowhere on its path.
    assert Path(seen["client_file"]).is_relative_to(venv_python.parent.parent)
    assert seen["app_found"] is False
    # The text as deltas, the upstream's own words: the simulator asked directly, without the
    # gateway, answers the same prompt with the same text.
    direct = gw.post(
        "/v1/chat/completions",
        {"model": MODEL, "messages": [{"role": "user", "content": PROMPT}]},
        base=gw.sim_url,
    )
    assert direct.status == 200
    expected = json.loads(direct.data)["choices"][0]["message"]["content"]
    assert len(seen["deltas"]) > 1 and "".join(seen["deltas"]) == expected
    assert seen["finish_reason"] == "stop"
    assert gw.sim_stats()["streams_completed"] == 1
