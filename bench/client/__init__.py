"""What a client sees of its connection: a WAN round trip and TLS, with and without llmgate
(the seed table: seed.py, `python -m bench.client.seed`), and HTTP/1.1 against HTTP/2 at
nginx (http2.py). Both are sections of the report."""
