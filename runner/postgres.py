"""A PostgreSQL cluster of the runner's own, for the spend ledger: `make run-cluster` starts one
where PostgreSQL is installed, and the tests start theirs the same way.

``initdb`` makes the cluster in a directory of the run directory, then the server runs in the
foreground as one more child (runner/procs.py: its log beside the others', stopped with the
stack), on a loopback port and no Unix socket, trusting loopback callers: a cluster for one
machine's gateway, never exposed. PostgreSQL refuses to run as root, so as root the cluster
belongs to the ``postgres`` user (Debian's package makes it), else to ``nobody``.

Debian keeps the server's programs out of PATH, in /usr/lib/postgresql/<version>/bin: they are
looked for there too, the newest version first.
"""

from __future__ import annotations

import os
import pwd
import shutil
import signal
import subprocess
import time
from pathlib import Path

from runner.procs import Proc, StartError, find_binary

USER = "llmgate"  # the cluster's superuser, and the database the gateway uses
DATABASE = "llmgate"
INSTALL_HINT = "sudo apt-get install -y postgresql"


def find_program(name: str) -> str | None:
    """``name`` (initdb, postgres, createdb) on PATH, else in Debian's versioned folders."""
    found = find_binary(name)
    if found is not None:
        return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0,
        reverse=True,
    )
    return str(versions[0]) if versions else None


def installed() -> bool:
    return all(find_program(name) for name in ("initdb", "postgres", "createdb"))


def _owner() -> str | None:
    """The user the cluster runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    try:
        pwd.getpwnam("postgres")
        return "postgres"
    except KeyError:
        return "nobody"


def url(port: int) -> str:
    return f"postgresql://{USER}@127.0.0.1:{port}/{DATABASE}"


def start(data_dir: Path, port: int, log_path: Path, *, stdout: bool = False) -> Proc:
    """A new cluster in ``data_dir`` (made when missing, kept when there: a restart), served on
    127.0.0.1:``port``, with the gateway's database in it; the running server."""
    programs = {name: find_program(name) for name in ("initdb", "postgres", "createdb")}
    missing = [name for name, path in programs.items() if path is None]
    if missing:
        raise StartError(f"PostgreSQL is not installed ({', '.join(missing)}): {INSTALL_HINT}")
    owner = _owner()
    fresh = not (data_dir / "PG_VERSION").exists()
    if fresh:
        data_dir.mkdir(parents=True, exist_ok=True)
        if owner is not None:
            shutil.chown(data_dir, owner, owner)
        data_dir.chmod(0o700)
        initdb = [str(programs["initdb"]), "-D", str(data_dir), "-U", USER, "--auth=trust"]
        done = subprocess.run(
            [*initdb, "-E", "UTF8", "--no-sync", "--no-instructions"],
            capture_output=True,
            text=True,
            user=owner,
            check=False,
        )
        if done.returncode != 0:
            raise StartError(f"initdb failed: {(done.stderr or done.stdout).strip()[-300:]}")
    argv = [str(programs["postgres"]), "-D", str(data_dir), "-p", str(port)]
    argv += ["-c", "listen_addresses=127.0.0.1", "-c", "unix_socket_directories="]
    # SIGINT is PostgreSQL's fast shutdown: it ends its sessions rather than wait for them.
    proc = Proc(
        "postgres", argv, log_path=log_path, stdout=stdout, user=owner, stop_signal=signal.SIGINT
    )
    try:
        proc.wait_port(port)
        if fresh:
            _create_database(str(programs["createdb"]), port, proc)
    except BaseException:
        proc.stop()
        raise
    return proc


def _create_database(createdb: str, port: int, proc: Proc, timeout_s: float = 20.0) -> None:
    """The gateway's database, once the server takes connections (it listens a moment before
    it is ready: "the database system is starting up")."""
    argv = [createdb, "-h", "127.0.0.1", "-p", str(port), "-U", USER, DATABASE]
    end = time.monotonic() + timeout_s
    while True:
        done = subprocess.run(argv, capture_output=True, text=True, check=False)
        if done.returncode == 0:
            return
        if "starting up" not in done.stderr or time.monotonic() > end or not proc.alive():
            raise StartError(f"createdb failed: {done.stderr.strip()[-300:]}")
        time.sleep(0.1)
