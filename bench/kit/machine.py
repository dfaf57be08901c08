"""Where a benchmark ran: the machine, the versions of what it ran, how busy the machine was.

Read from /proc, the interpreter and the binaries themselves at run time, so a report states
the facts of its own run. ``busy()`` samples /proc/stat: the share of all cores some process
used during an interval, ours included; ``Others`` the share used by every process but ours
during a measurement (the noise in it).
"""

from __future__ import annotations

import os
import platform
import subprocess
import time
from importlib import metadata
from pathlib import Path

from bench.kit import proctree
from runner.procs import find_binary

ROOT = Path(__file__).resolve().parents[2]


def machine() -> dict[str, str]:
    model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            model = line.split(":", 1)[1].strip()
            break
    mem_kb = 0
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            mem_kb = int(line.split()[1])
    return {
        "CPU": model,
        "cores": str(os.cpu_count()),
        "RAM": f"{mem_kb / 2**20:.1f} GiB",
        "kernel": platform.release(),
        "load average at start": " ".join(f"{v:.2f}" for v in os.getloadavg()),
    }


def _output(argv: list[str]) -> str:
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
    except OSError:
        return "unknown"
    return (done.stdout + done.stderr).strip()


def versions() -> dict[str, str]:
    nginx = find_binary("nginx")
    found = {
        "python": platform.python_version(),
        "nginx": _output([nginx, "-v"]).rsplit("/", 1)[-1] if nginx else "absent",
        "memcached": _output([m, "-V"]).split()[-1]
        if (m := find_binary("memcached"))
        else "absent",
    }
    for package in ("gunicorn", "gevent", "urllib3", "flask", "pymemcache", "matplotlib"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = "absent"
    git = ["git", "-C", str(ROOT)]
    commit = subprocess.run([*git, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
    if commit.returncode:
        found["llmgate"] = "unknown (not a git checkout)"
    else:
        dirty = _output([*git, "status", "--porcelain", "--untracked-files=no"])
        found["llmgate"] = commit.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    return found


def _ticks() -> tuple[int, int]:
    """(busy, total) jiffies of all cores since boot."""
    fields = [int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]]
    total = sum(fields[:8])  # guest time is in user time already; steal is someone else's use
    return total - fields[3] - fields[4], total  # busy = all but idle and iowait


def busy(seconds: float = 1.0) -> float:
    """The share of all cores in use over ``seconds`` (0.0 idle, 1.0 every core busy)."""
    b0, t0 = _ticks()
    time.sleep(seconds)
    b1, t1 = _ticks()
    return (b1 - b0) / (t1 - t0) if t1 > t0 else 0.0


class Others:
    """The share of all cores that processes other than ``ours`` used, from ``__init__`` to
    ``share()``: /proc/stat's busy time of every core less ``ours``' utime + stime."""

    def __init__(self, ours: list[int]) -> None:
        self.ours = ours
        self.busy0, self.total0 = _ticks()
        self.ours0 = proctree.cpu_s(ours)

    def share(self) -> float:
        busy, total = _ticks()
        if total <= self.total0:
            return 0.0
        ours = (proctree.cpu_s(self.ours) - self.ours0) * proctree.TICK
        return max(0.0, (busy - self.busy0 - ours) / (total - self.total0))
