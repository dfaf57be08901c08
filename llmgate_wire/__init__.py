"""llmgate_wire: what the gateway and its client both read off the wire. Standard library
only, no I/O.

    sse.py          the server-sent events codec: bytes in, events out, each event keeping
                    its exact bytes (the gateway relays them, the client decodes them)
    retry_after.py  the wait a server asks for in ``retry-after-ms`` / ``retry-after``

One copy, two users: the gateway (``app``) imports it from the checkout; the client
(``llmgate_client``) imports it too, and it ships with the client in the ``llmgate-client``
distribution (pyproject.toml). It imports neither of them, so either can be read, tested and
shipped without the other.
"""
