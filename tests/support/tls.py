"""A TLS front for a plain TCP server on loopback, and a throwaway certificate for it.

Tests use it to put https in front of the simulator, so the gateway's real upstream path
(TLS handshake, certificate verification, pooled TLS connections) runs without a network.
One thread per connection does both directions, so an SSL object is never used by two
threads at once.
"""

from __future__ import annotations

import collections
import selectors
import socket
import ssl
import subprocess
import threading
from pathlib import Path


def make_certificate(folder: Path, openssl: str, host: str = "127.0.0.1") -> tuple[Path, Path]:
    """A self-signed certificate for ``host`` (valid one day): (cert, key) paths."""
    cert, key = folder / "upstream.crt", folder / "upstream.key"
    subprocess.run(
        [
            openssl,
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            f"/CN={host}",
            "-addext",
            f"subjectAltName=IP:{host}",
            "-keyout",
            str(key),
            "-out",
            str(cert),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return cert, key


class TLSFront:
    def __init__(
        self,
        target_port: int,
        cert: Path,
        key: Path,
        max_version: ssl.TLSVersion = ssl.TLSVersion.MAXIMUM_SUPPORTED,
    ) -> None:
        self.target_port = target_port
        self.context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        self.context.load_cert_chain(cert, key)
        # TLSv1_2 makes every client use TLS 1.2's full handshake (one round trip more).
        self.context.maximum_version = max_version
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.handshakes = 0
        self.versions: collections.Counter[str] = collections.Counter()  # handshakes by version
        self._stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while not self._stopped.is_set():
            try:
                raw, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._serve, args=(raw,), daemon=True).start()

    def _serve(self, raw: socket.socket) -> None:
        # Both ways, or Nagle holds a write behind the peer's delayed ACK: a TLS 1.2
        # handshake's second flight and a request's body (written after its headers) each
        # waited 40 ms on loopback.
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            client = self.context.wrap_socket(raw, server_side=True)
        except (OSError, ssl.SSLError):
            raw.close()
            return
        self.handshakes += 1
        self.versions[client.version() or "?"] += 1
        upstream = socket.create_connection(("127.0.0.1", self.target_port))
        upstream.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        # A selector, not select(): a test process with over 1,024 descriptors open (a full
        # suite's stacks) made select() raise "filedescriptor out of range".
        watch = selectors.DefaultSelector()
        watch.register(client, selectors.EVENT_READ)
        watch.register(upstream, selectors.EVENT_READ)
        try:
            while not self._stopped.is_set():
                if not client.pending():
                    ready = [key.fileobj for key, _ in watch.select(0.5)]
                else:
                    ready = [client]
                if client in ready:
                    data = client.recv(65536)
                    if not data:
                        return
                    upstream.sendall(data)
                if upstream in ready:
                    data = upstream.recv(65536)
                    if not data:
                        return
                    client.sendall(data)
        except (OSError, ssl.SSLError):
            return
        finally:
            watch.close()
            client.close()
            upstream.close()

    def stop(self) -> None:
        self._stopped.set()
        self.listener.close()
