"""An upstream's answer as the translation reads it (urllib3's response), made of given bytes:
for reading a provider's documented answer through app/upstream/translation.py without a
socket."""

from __future__ import annotations

import urllib3


class PieceRaw:
    """urllib3's answer as ``Translated`` reads it: pieces of body, then its end."""

    def __init__(
        self, pieces: list[bytes], ctype: str = "text/event-stream", status: int = 200
    ) -> None:
        self.pieces = list(pieces)
        self.status = status
        self.headers = urllib3.HTTPHeaderDict({"content-type": ctype})
        self.closed = False
        self.released = False

    def read1(self, amt: int | None = None) -> bytes:
        return self.pieces.pop(0) if self.pieces else b""

    def read(self) -> bytes:
        return b"".join(self.pieces)

    def close(self) -> None:
        self.closed = True

    def release_conn(self) -> None:
        self.released = True
