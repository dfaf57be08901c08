"""Command line: `chat` streams one answer to the terminal, `batch` runs a JSONL file.

    python -m llmgate_client chat "prompt" [--model M] [--system S] [--no-stream] [--no-resume]
    python -m llmgate_client batch in.jsonl out.jsonl --workers N [--deadline S]

Both take --base-url and --api-key; otherwise LLMGATE_BASE_URL / LLMGATE_API_KEY, then
OPENAI_BASE_URL / OPENAI_API_KEY, then the local gateway (http://127.0.0.1:8080). The base
URL may end in /v1 or not. `chat` streams resumably: when the connection drops mid-answer it
reconnects to the gateway and goes on, each piece printed once (--no-resume: the drop is an
error). Answer text and result lines go to stdout (or the output file); progress, notes and
the summary go to stderr. Exit status: 0 all calls succeeded, 1 a call failed, 2 bad usage,
130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Iterator, Sequence
from typing import Any, TextIO

from .batch import Outcome
from .client import Client, Result
from .errors import LLMGateError
from .policy import Timeout


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        return int(args.run(args))
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return 130


# -- chat ---------------------------------------------------------------------------------


def run_chat(args: argparse.Namespace) -> int:
    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    messages = [{"role": "user", "content": prompt}]
    if args.system:
        messages.insert(0, {"role": "system", "content": args.system})
    params: dict[str, Any] = {}
    if args.max_tokens is not None:
        params["max_tokens"] = args.max_tokens
    if args.temperature is not None:
        params["temperature"] = args.temperature
    out = sys.stdout
    wrote = False
    with _client(args, pool_size=1, resume=not args.no_resume) as client:
        try:
            if args.no_stream:
                result = client.chat(messages, model=args.model, **params)
                out.write((result.text or "") + "\n")
                return 0
            with client.chat_stream(messages, model=args.model, **params) as stream:
                for piece in stream.text_deltas():
                    out.write(piece)
                    out.flush()  # token by token, even into a pipe
                    wrote = True
            out.write("\n")
            if stream.resumes:  # stdout is the answer alone; say it on stderr
                drops = stream.resumes
                print(f"note: resumed after {drops} dropped connection(s)", file=sys.stderr)
        except LLMGateError as exc:
            if wrote:
                out.write("\n")
            print(f"error: {type(exc).__name__}: {exc}", file=sys.stderr)
            return 1
        finally:
            out.flush()
    return 0


# -- batch --------------------------------------------------------------------------------


class InvalidRequest(ValueError):
    """An input line that is not a JSON object: ``imap`` records it as that line's error."""


def _read_requests(handle: TextIO, lines: list[int]) -> Iterator[Any]:
    """Yield one request per non-blank line, recording each one's line number in ``lines``."""
    for number, line in enumerate(handle, start=1):
        if not line.strip():
            continue
        lines.append(number)
        try:
            value = json.loads(line)
        except ValueError as exc:
            yield InvalidRequest(f"line {number} is not JSON: {exc}")
            continue
        yield value if isinstance(value, dict) else InvalidRequest(f"line {number}: not an object")


def run_batch(args: argparse.Namespace) -> int:
    if args.workers < 1:
        print("error: --workers must be >= 1", file=sys.stderr)
        return 2
    source = sys.stdin if args.input == "-" else open(args.input, encoding="utf-8")  # noqa: SIM115
    sink = sys.stdout if args.output == "-" else open(args.output, "w", encoding="utf-8")  # noqa: SIM115
    total = None if args.input == "-" else _count_requests(args.input)
    bar = ProgressBar(sys.stderr, total, enabled=not args.no_progress)
    lines: list[int] = []
    stats = Summary()
    started = time.monotonic()
    try:
        with _client(args, pool_size=args.workers) as client:
            requests = (_with_model(r, args.model) for r in _read_requests(source, lines))
            outcomes = client.imap(
                requests,
                max_workers=args.workers,
                deadline=args.deadline,
                progress=lambda done, _total, outcome: bar.update(done, outcome.ok),
            )
            for outcome in outcomes:
                record = outcome_record(outcome, lines[outcome.index])
                sink.write(json.dumps(record, ensure_ascii=False) + "\n")
                stats.add(outcome)
    finally:
        bar.finish()
        if source is not sys.stdin:
            source.close()
        if sink is not sys.stdout:
            sink.close()
        else:
            sink.flush()
    print(stats.render(time.monotonic() - started), file=sys.stderr)
    return 0 if stats.failed == 0 else 1


def _with_model(request: Any, model: str | None) -> Any:
    if isinstance(request, InvalidRequest):
        return request
    if model and "model" not in request:
        request = {**request, "model": model}
    return request


def _count_requests(path: str) -> int:
    with open(path, encoding="utf-8") as handle:
        return sum(1 for line in handle if line.strip())


def outcome_record(outcome: Outcome[Result], line: int) -> dict[str, Any]:
    """The output line for one input line: the response, or a JSON description of the error."""
    record: dict[str, Any] = {
        "line": line,
        "ok": outcome.ok,
        "latency_ms": round(outcome.latency * 1000, 1),
        "attempts": outcome.attempts,
    }
    if outcome.result is not None:
        record["request_id"] = outcome.result.request_id
        record["response"] = dict(outcome.result)
    elif isinstance(outcome.error, LLMGateError):
        record["request_id"] = outcome.error.request_id
        record["error"] = outcome.error.to_dict()
    else:
        record["error"] = {"error": type(outcome.error).__name__, "message": str(outcome.error)}
    return record


def percentile(values: Sequence[float], p: float) -> float | None:
    """Nearest-rank percentile (``p`` in 0..100); None for no values."""
    if not values:
        return None
    ordered = sorted(values)
    rank = max(1, -(-len(ordered) * p // 100))  # ceil(n * p / 100), at least 1
    return ordered[int(rank) - 1]


class Summary:
    """Counts and the latency of every call that ran (successful or not)."""

    def __init__(self) -> None:
        self.ok = 0
        self.failed = 0
        self.latencies: list[float] = []

    def add(self, outcome: Outcome[Any]) -> None:
        if outcome.ok:
            self.ok += 1
        else:
            self.failed += 1
        if outcome.attempts > 0:
            self.latencies.append(outcome.latency)

    def render(self, wall: float) -> str:
        def fmt(value: float | None) -> str:
            return "-" if value is None else f"{value:.3f}s"

        p50 = percentile(self.latencies, 50)
        p95 = percentile(self.latencies, 95)
        return f"ok={self.ok} failed={self.failed} p50={fmt(p50)} p95={fmt(p95)} wall={wall:.2f}s"


class ProgressBar:
    """A one-line bar redrawn with CR on a terminal; a line per 10 % step otherwise."""

    WIDTH = 30

    def __init__(self, stream: TextIO, total: int | None, *, enabled: bool = True) -> None:
        self.stream = stream
        self.total = total
        self.enabled = enabled
        self.tty = stream.isatty()
        self.done = 0
        self.failed = 0
        self._last_draw = 0.0
        self._last_step = -1

    def update(self, done: int, ok: bool) -> None:
        self.done = done
        self.failed += 0 if ok else 1
        if not self.enabled:
            return
        if self.tty:
            now = time.monotonic()
            if now - self._last_draw >= 0.1 or done == self.total:
                self._last_draw = now
                self.stream.write("\r" + self.render())
                self.stream.flush()
        else:
            step = done * 10 // self.total if self.total else done // 100
            if step != self._last_step:
                self._last_step = step
                self.stream.write(self.render() + "\n")
                self.stream.flush()

    def render(self) -> str:
        counts = f"{self.done}/{self.total if self.total is not None else '?'} failed {self.failed}"
        if not self.total:
            return f"[{counts}]"
        filled = self.WIDTH * self.done // self.total
        return f"[{'#' * filled}{'.' * (self.WIDTH - filled)}] {counts}"

    def finish(self) -> None:
        if self.enabled and self.tty:
            self.stream.write("\r" + self.render() + "\n")
            self.stream.flush()


# -- wiring -------------------------------------------------------------------------------


def _client(args: argparse.Namespace, *, pool_size: int, resume: bool = True) -> Client:
    timeout: float | Timeout = args.timeout if args.timeout is not None else Timeout()
    return Client(
        args.base_url,
        args.api_key,
        timeout=timeout,
        retries=args.retries,
        pool_size=pool_size,
        resume=resume,
    )


def _parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--base-url", help="API root, with or without /v1 (env: LLMGATE_BASE_URL)")
    common.add_argument("--api-key", help="bearer token (env: LLMGATE_API_KEY, OPENAI_API_KEY)")
    common.add_argument(
        "--model",
        default=os.environ.get("LLMGATE_MODEL"),
        help="model name (env: LLMGATE_MODEL); batch: only where a request has none",
    )
    common.add_argument("--timeout", type=float, help="total deadline per call, in seconds")
    common.add_argument("--retries", type=int, default=2, help="retries per call (default 2)")

    parser = argparse.ArgumentParser(
        prog="python -m llmgate_client",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    sub = parser.add_subparsers(dest="command", required=True)

    chat = sub.add_parser("chat", parents=[common], help="stream one answer to the terminal")
    chat.add_argument("prompt", help="the user message ('-' reads it from stdin)")
    chat.add_argument("--system", help="a system message")
    chat.add_argument("--max-tokens", type=int)
    chat.add_argument("--temperature", type=float)
    chat.add_argument("--no-stream", action="store_true", help="one request, whole answer")
    chat.add_argument(
        "--no-resume",
        action="store_true",
        help="do not ask for a resumable stream: a dropped connection ends the answer",
    )
    chat.set_defaults(run=run_chat)

    batch = sub.add_parser("batch", parents=[common], help="run a JSONL file of chat requests")
    batch.add_argument("input", help="JSONL, one chat request body per line ('-': stdin)")
    batch.add_argument("output", help="JSONL, one result or error per request ('-': stdout)")
    batch.add_argument("--workers", type=int, default=8, help="concurrent calls (default 8)")
    batch.add_argument("--deadline", type=float, help="stop starting calls after S seconds")
    batch.add_argument("--no-progress", action="store_true", help="no progress on stderr")
    batch.set_defaults(run=run_batch)
    return parser
