"""SSE decoder cost: CPU per input, measured with process time (no sockets, no other load).

    long line   one 16 MiB `data:` line fed in 64 KiB reads (what an upstream sending a huge
                event looks like to the relay): the decoder must stay linear in its input
    events      200,000 chat-sized events (48 bytes) in 64 KiB reads: the per-event cost

Numbers, not asserts: the issue's target for the long line is under 100 ms of CPU.
"""

from __future__ import annotations

import time

from llmgate_wire import sse

READ = 64 * 1024


def _feed_all(data: bytes, max_event_bytes: int | None = None) -> tuple[int, float]:
    decoder = sse.Decoder(max_event_bytes)
    started = time.process_time()
    events = 0
    for i in range(0, len(data), READ):
        events += len(decoder.feed(data[i : i + READ]))
    return events, time.process_time() - started


def main(rounds: int = 5) -> None:
    line = b"data: " + b"x" * (16 * 1024 * 1024) + b"\n\n"
    small = b'data: {"choices":[{"delta":{"content":"hi"}}]}\n\n' * 200_000
    print(f"SSE decoder, CPU per input (best of {rounds}, 64 KiB reads)")
    print(f"{'input':<40}{'events':>10}{'CPU ms':>10}{'MiB/s':>10}")
    for name, data in (("one 16 MiB line", line), ("200,000 events of 48 bytes", small)):
        best = min((_feed_all(data) for _ in range(rounds)), key=lambda r: r[1])
        events, cpu = best
        print(f"{name:<40}{events:>10}{cpu * 1000:>10.1f}{len(data) / cpu / 2**20:>10.0f}")
    events, cpu = min((_feed_all(line, 32 * 2**20) for _ in range(rounds)), key=lambda r: r[1])
    print(f"{'16 MiB line, 32 MiB event limit':<40}{events:>10}{cpu * 1000:>10.1f}")


if __name__ == "__main__":
    main()
