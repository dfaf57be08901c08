"""Headless Chromium for the status page's tests: its flags, the page's data attributes read
back from its HTML, and just enough of the DevTools protocol to drive a tab in real time
(navigate, evaluate, wait, screenshot, answer an HTTP auth challenge).
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import subprocess
import time
from collections.abc import Callable
from html.parser import HTMLParser
from pathlib import Path

CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--window-size=1280,800",
]
CHARTS = ["ttft", "latency", "rps", "errors", "cache", "streams", "pool", "activity"]


class Page:
    def __init__(self) -> None:
        self.samples = -1
        self.history = -1  # of the samples, how many came from the gateway's history
        self.oldest: float | None = None  # the time of the oldest sample held
        self.state = ""
        self.charts: dict[str, dict[str, str]] = {}
        self.keys: dict[str, str] = {}  # the keys table's section attributes
        self.key_rows: dict[str, dict[str, str]] = {}  # by key name
        self.key_text: dict[str, str] = {}  # each row's text, cells joined by " | "

    def __repr__(self) -> str:
        return (
            f"Page(samples={self.samples}, history={self.history}, oldest={self.oldest}, "
            f"state={self.state!r}, charts={self.charts}, keys={self.keys}, "
            f"key_rows={self.key_rows}, key_text={self.key_text})"
        )


def parse_page(html: str) -> Page:
    """The data attributes of the charts and the keys table, the samples held and the
    connection state."""
    page = Page()

    class Parser(HTMLParser):
        row: str | None = None

        def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
            a = {k: v or "" for k, v in attrs}
            if "chart" in a.get("class", "").split():
                page.charts[a["id"].removeprefix("chart-")] = a
            elif a.get("id") == "charts":
                page.samples = int(a["data-samples"])
                page.history = int(a.get("data-history", "-1"))
                page.oldest = float(a["data-from"]) if a.get("data-from") else None
            elif a.get("id") == "state":
                page.state = a["data-state"]
            elif a.get("id") == "keys":
                page.keys = a
            elif tag == "tr" and "data-key" in a:
                self.row = a["data-key"]
                page.key_rows[self.row] = a
                page.key_text[self.row] = ""
            elif tag == "td" and self.row is not None and page.key_text[self.row]:
                page.key_text[self.row] += " | "

        def handle_endtag(self, tag: str) -> None:
            if tag == "tr":
                self.row = None

        def handle_data(self, data: str) -> None:
            if self.row is not None:
                page.key_text[self.row] += data

    Parser().feed(html)
    assert sorted(page.charts) == sorted(CHARTS), page
    return page


class DevTools:
    """Just enough of the Chrome DevTools protocol over ``--remote-debugging-pipe``:
    JSON messages ending in NUL; Chromium reads them on fd 3 and writes on fd 4."""

    def __init__(self, argv: list[str], *, log: Path) -> None:
        self.argv = argv
        self.log_path = log
        self._next_id = 0
        self._sent_id = 1 << 30  # ids of messages whose answers nobody waits for
        self._buffer = b""
        # Events by method, handled while a call waits for its answer: (params, session).
        self.on: dict[str, Callable[[dict, str | None], None]] = {}
        self.challenges: list[str] = []  # URLs whose HTTP auth challenge open() answered

    def __enter__(self) -> DevTools:
        to_chrome, self._writer = os.pipe()
        self._reader, from_chrome = os.pipe()
        # bash moves our pipe ends to the fds Chromium expects (dash takes only fds 0-9).
        script = f'exec "$@" --remote-debugging-pipe 3<&{to_chrome} 4>&{from_chrome}'
        self._log = self.log_path.open("wb")
        self.proc = subprocess.Popen(
            ["bash", "-c", script, "bash", *self.argv],
            pass_fds=(to_chrome, from_chrome),
            stdin=subprocess.DEVNULL,
            stdout=self._log,
            stderr=self._log,
        )
        os.close(to_chrome)
        os.close(from_chrome)
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError, RuntimeError, TimeoutError):
            self.call("Browser.close", timeout=5)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        os.close(self._writer)
        os.close(self._reader)
        self._log.close()

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params):
        self._next_id += 1
        message: dict = {"id": self._next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._writer, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline, method)
            handler = self.on.get(reply.get("method", ""))
            if handler is not None:
                handler(reply.get("params", {}), reply.get("sessionId"))
            elif reply.get("id") == self._next_id:  # other answers and events: not needed
                if "error" in reply:
                    raise RuntimeError(f"{method}: {reply['error']}")
                return reply.get("result", {})

    def send(self, method: str, session: str | None = None, **params) -> None:
        """A command whose answer is not waited for (an event handler's)."""
        self._sent_id += 1
        message: dict = {"id": self._sent_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self._writer, json.dumps(message).encode() + b"\0")

    def _receive(self, deadline: float, method: str) -> dict:
        while b"\0" not in self._buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not _readable(self._reader, left):
                raise TimeoutError(f"chromium did not answer {method}")
            chunk = os.read(self._reader, 1 << 20)
            if not chunk:
                raise RuntimeError(f"chromium exited (status {self.proc.poll()}) during {method}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def open(
        self, url: str, *, width: int, height: int, login: tuple[str, str] | None = None
    ) -> str:
        """A new tab at ``url`` with a ``width`` x ``height`` viewport; its session id. With
        ``login``, the tab answers HTTP auth challenges with that (user, password), as a
        person would in the browser's dialog, and ``self.challenges`` lists their URLs."""
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        self.call(
            "Emulation.setDeviceMetricsOverride",
            session,
            width=width,
            height=height,
            deviceScaleFactor=1,
            mobile=False,
        )
        if login is not None:
            self._answer_challenges(session, *login)
        self.call("Page.navigate", session, url=url)
        return session

    def _answer_challenges(self, session: str, user: str, password: str) -> None:
        # Intercepting auth means every request pauses: each is let through as it was.

        def paused(params: dict, sid: str | None) -> None:
            self.send("Fetch.continueRequest", sid, requestId=params["requestId"])

        def challenged(params: dict, sid: str | None) -> None:
            self.challenges.append(params["request"]["url"])
            answer = {"response": "ProvideCredentials", "username": user, "password": password}
            self.send(
                "Fetch.continueWithAuth",
                sid,
                requestId=params["requestId"],
                authChallengeResponse=answer,
            )

        self.on["Fetch.requestPaused"] = paused
        self.on["Fetch.authRequired"] = challenged
        self.call("Fetch.enable", session, handleAuthRequests=True, patterns=[{"urlPattern": "*"}])

    def evaluate(self, session: str, expression: str):
        result = self.call("Runtime.evaluate", session, expression=expression, returnByValue=True)
        if "exceptionDetails" in result:
            raise RuntimeError(f"{expression}: {result['exceptionDetails']}")
        return result["result"].get("value")

    def wait_for(self, session: str, expression: str, timeout: float = 30) -> None:
        deadline = time.monotonic() + timeout
        while not self.evaluate(session, f"!!({expression})"):
            if time.monotonic() > deadline:
                raise TimeoutError(f"page never satisfied {expression}")
            time.sleep(0.25)


def _readable(fd: object, seconds: float) -> bool:
    """Whether ``fd`` has something to read within ``seconds``. A selector, not select(): in a
    test process with over 1,024 descriptors open (a whole suite's stacks) select() raises."""
    with selectors.DefaultSelector() as watch:
        watch.register(fd, selectors.EVENT_READ)  # type: ignore[arg-type]
        return bool(watch.select(seconds))
