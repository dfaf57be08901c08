"""The certificate of `make run`'s HTTPS listener: the operator's, or a self-signed one.

With LLMGATE_TLS_CERT and LLMGATE_TLS_KEY unset, ``self_signed`` makes an ECDSA P-256
certificate for localhost, 127.0.0.1 and ::1 with the openssl command line (no network, no
Python dependency) in the run directory, and keeps it across runs so a caller can trust it
once. Without openssl it raises StartError and the runner serves plain HTTP only.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from runner.procs import StartError, find_binary

NAMES = "DNS:localhost,IP:127.0.0.1,IP:::1"


def self_signed(folder: Path) -> tuple[Path, Path]:
    """(certificate, key) in ``folder``, made unless both are already there."""
    cert, key = folder / "llmgate.crt", folder / "llmgate.key"
    if cert.is_file() and key.is_file():
        return cert, key
    openssl = find_binary("openssl")
    if openssl is None:
        raise StartError("openssl is not installed: no self-signed certificate for HTTPS")
    folder.mkdir(parents=True, exist_ok=True)
    argv = [
        openssl,
        "req",
        "-x509",
        "-newkey",
        "ec",
        "-pkeyopt",
        "ec_paramgen_curve:prime256v1",
        "-nodes",
        "-days",
        "365",
        "-subj",
        "/CN=localhost",
        "-addext",
        f"subjectAltName={NAMES}",
        "-keyout",
        str(key),
        "-out",
        str(cert),
    ]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise StartError(f"openssl could not make a certificate: {done.stderr.strip()}")
    # nginx's master reads the key before its workers drop to nobody: owner only.
    os.chmod(key, 0o600)
    return cert, key
