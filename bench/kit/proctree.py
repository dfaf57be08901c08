"""CPU and memory of a process tree, read from /proc (Linux only).

The gateway is a tree of processes: nginx's master and workers, gunicorn's master and
workers. Its CPU per request is the growth of the tree's utime + stime (/proc/PID/stat
fields 14 and 15, in clock ticks) over a run, divided by the requests of that run; its memory
is the sum of VmRSS; its connections to a port are its sockets (/proc/PID/fd) found
ESTABLISHED to that port in /proc/net/tcp and tcp6. A process that exits between the listing
and the read is skipped.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

TICK = os.sysconf("SC_CLK_TCK")


def tree(pid: int) -> list[int]:
    """``pid`` and all its descendants."""
    try:
        kids = Path(f"/proc/{pid}/task/{pid}/children").read_text().split()
    except OSError:
        return [pid]
    return [pid] + [p for k in kids for p in tree(int(k))]


def cpu_s(pids: list[int]) -> float:
    """User + system CPU seconds of ``pids`` (not of their children)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            total += int(fields[11]) + int(fields[12])
    return total / TICK


def rss_kb(pids: list[int]) -> int:
    """Resident memory of ``pids``, KiB (shared pages counted in each process)."""
    total = 0
    for pid in pids:
        with contextlib.suppress(OSError):
            for line in Path(f"/proc/{pid}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1])
    return total


def children(pid: int) -> list[int]:
    """The direct children of ``pid`` (gunicorn's or nginx's workers)."""
    with contextlib.suppress(OSError):
        return [int(p) for p in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    return []


def connections_to(pids: list[int], port: int) -> int:
    """TCP connections of ``pids`` established to ``port`` (on any address): what the OS
    says they hold, whoever else connects to that port meanwhile."""
    inodes: set[str] = set()
    for pid in pids:
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    link = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if link.startswith("socket:["):
                        inodes.add(link[8:-1])
    wanted = f"{port:04X}"
    count = 0
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        with contextlib.suppress(OSError):
            for line in Path(table).read_text().splitlines()[1:]:
                fields = line.split()
                # local, remote (hex address:port), state 01 = ESTABLISHED, ..., inode
                if fields[2].endswith(":" + wanted) and fields[3] == "01" and fields[9] in inodes:
                    count += 1
    return count
