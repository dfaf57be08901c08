"""The docs' examples run as written against a gateway started as `make run` starts it.

Every block marked ``<!-- example: run -->`` in README.md and docs/client.md
(tests/support/doc_examples.py) runs as a reader would run it, in a fresh folder: a sh block
in bash, a python block as a script, with the venv's ``python`` first on PATH, the checkout
importable (as after the README's ``pip install``), and no OPENAI_API_KEY or OPENAI_BASE_URL
(a new user has neither). One rewrite, and only one: the docs' http://127.0.0.1:8080 is the
free port this gateway got, in the block's text and as LLMGATE_BASE_URL (where the sync
client and its CLI look when a block names no URL; their default is that same 8080).

Each must exit 0 and reach the upstream (the simulator counts more requests after it than
before); a ``curl -N`` stream must print SSE: JSON ``data:`` events, ending with [DONE]
(curl exits 0 on an HTTP error status: its output is the proof).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import urllib3

from tests.conftest import ROOT, require_binary
from tests.support.doc_examples import EXAMPLE_DOCS, SHELL, Block, parse
from tests.support.runner_cli import Runner

DOCS_URL = "http://127.0.0.1:8080"

EXAMPLES = [
    block
    for doc in EXAMPLE_DOCS
    for block in parse((ROOT / doc).read_text(), doc).blocks
    if block.runs
]


@pytest.fixture(scope="module")
def run(runs_dir) -> Iterator[Runner]:
    require_binary("nginx")
    require_binary("memcached")
    require_binary("curl")
    with Runner(runs_dir / "doc-examples") as runner:
        yield runner
    assert runner.returncode == 0, runner.rest


def _sim_requests(run: Runner) -> int:
    found = re.search(r"upstream:\s+simulator at (\S+)", run.banner)
    assert found, run.banner
    stats = urllib3.request("GET", found.group(1) + "/sim/stats", retries=False).json()
    return int(stats["requests"])


def _reader_env(run: Runner) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OPENAI_", "LLMGATE_"))}
    venv_bin = str(Path(sys.executable).parent)
    return {
        **env,
        "PATH": venv_bin + os.pathsep + env.get("PATH", ""),
        "PYTHONPATH": str(ROOT),
        "LLMGATE_BASE_URL": run.url,
    }


def _run_block(block: Block, run: Runner, folder: Path) -> subprocess.CompletedProcess[str]:
    text = block.text.replace(DOCS_URL, run.url)
    if block.lang in SHELL:
        argv = ["bash", "-e", "-c", text]
    else:
        script = folder / "example.py"
        script.write_text(text)
        argv = ["python", script.name]
    env = _reader_env(run)
    return subprocess.run(
        argv, cwd=folder, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _assert_sse(stdout: str) -> None:
    """A chat stream as ``curl -N`` prints it: every ``data:`` a JSON chunk, then [DONE]."""
    data = [line[len("data: ") :] for line in stdout.splitlines() if line.startswith("data: ")]
    assert data and data[-1] == "[DONE]", stdout
    chunks = [json.loads(payload) for payload in data[:-1]]
    assert chunks and all(c["object"] == "chat.completion.chunk" for c in chunks), stdout
    assert "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])


@pytest.mark.parametrize("block", EXAMPLES, ids=[b.where for b in EXAMPLES])
def test_example_runs_as_written(block: Block, run: Runner, tmp_path: Path) -> None:
    before = _sim_requests(run)
    done = _run_block(block, run, tmp_path)
    report = f"{block.where} exited {done.returncode}\n{done.stdout}\n{done.stderr}"
    assert done.returncode == 0, report
    assert "Traceback" not in done.stderr, report
    assert _sim_requests(run) > before, f"{block.where} never reached the upstream\n{report}"
    if block.lang in SHELL and "curl -N" in block.text:
        _assert_sse(done.stdout)
