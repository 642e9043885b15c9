"""Headless Chromium for the tests: Debian's `/usr/bin/chromium`, driven over the Chrome DevTools
Protocol on a pipe (no port, not even on 127.0.0.1), used by the tests that load the trajectory
viewer (tests/test_viewer.py) and the run report (tests/test_report.py) in a real browser.

Without Chromium those tests skip, unless TIRL_REQUIRE_BROWSER is set (CI's `.ci/run` installs
Debian's chromium and sets it): then they fail. Every browser started is recorded with the test
that started it, and the end of the run's report says how many of those tests passed and in
which Chromium (tests/conftest.py), so that CI's log shows that they ran.

It covers what these tests need (load a file:// page, evaluate JS, move and click the mouse,
read console and network events); it is not a general browser driver.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

CHROMIUM = Path("/usr/bin/chromium")
# Without the background-networking flags Chromium calls Google's hosts; nothing may leave here.
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-quic",
    "--disable-dev-shm-usage",
    "--no-default-browser-check",
    "--remote-debugging-pipe",
)
# Set by CI: a browser test fails, instead of skipping, where Chromium is missing.
REQUIRED = os.environ.get("TIRL_REQUIRE_BROWSER", "") not in ("", "0")
needs_chromium = pytest.mark.skipif(
    not CHROMIUM.exists() and not REQUIRED,
    reason=f"needs Debian's chromium at {CHROMIUM} (apt-get install -y chromium); "
    "TIRL_REQUIRE_BROWSER=1 makes this a failure",
)
# (test node id, browser product) for every Chromium started in this run.
STARTED: list[tuple[str, str]] = []


def summary_line(passed_ids: set[str]) -> str | None:
    """One line for the end of the run's report: how many of the tests that started a browser
    passed, and in which Chromium; None where no test started one."""
    if not STARTED:
        return None
    tests = sorted({test for test, _ in STARTED})
    products = ", ".join(sorted({product for _, product in STARTED}))
    ok = [t for t in tests if t in passed_ids]
    return f"browser tests: {len(ok)} of {len(tests)} passed in headless {products}: " + ", ".join(
        f"{t}{'' if t in ok else ' (FAILED)'}" for t in tests
    )


class DevTools:
    """The Chrome DevTools Protocol over `--remote-debugging-pipe`: Chromium reads commands on
    its fd 3 and writes replies and events on its fd 4, each a JSON object ended by a NUL byte.
    No port is opened, not even on 127.0.0.1."""

    def __init__(self, write_fd: int, read_fd: int) -> None:
        self.write_fd, self.read_fd = write_fd, read_fd
        self.buffer = b""
        self.next_id = 0
        self.events: list[dict] = []

    def _receive(self, deadline: float) -> dict:
        while b"\0" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.read_fd], [], [], left)[0]:
                raise TimeoutError("no message from Chromium")
            chunk = os.read(self.read_fd, 1 << 16)
            if not chunk:
                raise EOFError("Chromium closed the DevTools pipe")
            self.buffer += chunk
        message, _, self.buffer = self.buffer.partition(b"\0")
        return json.loads(message)

    def call(self, method: str, session: str | None = None, timeout: float = 30, **params):
        self.next_id += 1
        message = {"id": self.next_id, "method": method, "params": params}
        if session:
            message["sessionId"] = session
        os.write(self.write_fd, json.dumps(message).encode() + b"\0")
        deadline = time.monotonic() + timeout
        while True:
            reply = self._receive(deadline)
            if reply.get("id") != self.next_id:
                self.events.append(reply)
                continue
            if "error" in reply:
                raise RuntimeError(f"{method}: {reply['error']}")
            return reply.get("result", {})

    def wait_for(self, method: str, session: str, timeout: float = 30) -> dict:
        deadline = time.monotonic() + timeout
        seen = len(self.events)
        while True:
            for event in self.events[seen:]:
                if event.get("method") == method and event.get("sessionId") == session:
                    return event
            seen = len(self.events)
            self.events.append(self._receive(deadline))


def process_group(pgid: int) -> list[int]:
    """Live (not zombie) processes whose process group is `pgid`."""
    pids = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        if int(fields[2]) == pgid and fields[0] != "Z":
            pids.append(int(stat.parent.name))
    return pids


@contextlib.contextmanager
def chromium(profile: Path) -> Iterator[DevTools]:
    """A headless Chromium in its own process group, with DevTools on a pipe; on exit the
    browser is closed and anything left of the group is killed."""
    if not CHROMIUM.exists():
        pytest.fail(f"TIRL_REQUIRE_BROWSER is set and {CHROMIUM} is missing: "
                    "apt-get install -y --no-install-recommends chromium")  # fmt: skip
    to_chrome_r, to_chrome_w = os.pipe()
    from_chrome_r, from_chrome_w = os.pipe()

    def pipes_on_fds_3_and_4():  # runs in the child, before exec
        # Move both ends above 4 first, so placing one on 3 cannot clobber the other.
        r = fcntl.fcntl(to_chrome_r, fcntl.F_DUPFD_CLOEXEC, 10)
        w = fcntl.fcntl(from_chrome_w, fcntl.F_DUPFD_CLOEXEC, 10)
        os.dup2(r, 3)  # dup2 makes 3 and 4 inheritable
        os.dup2(w, 4)
        for fd in map(int, os.listdir("/proc/self/fd")):  # and nothing else reaches Chromium
            if fd > 4:
                with contextlib.suppress(OSError):
                    os.set_inheritable(fd, False)

    proc = subprocess.Popen(
        [str(CHROMIUM), *CHROMIUM_FLAGS, f"--user-data-dir={profile}", "about:blank"],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        close_fds=False,
        preexec_fn=pipes_on_fds_3_and_4,
        start_new_session=True,
    )
    os.close(to_chrome_r)
    os.close(from_chrome_w)
    devtools = DevTools(to_chrome_w, from_chrome_r)
    try:
        test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
        STARTED.append((test, devtools.call("Browser.getVersion")["product"]))
        yield devtools
    finally:
        with contextlib.suppress(Exception):
            devtools.call("Browser.close", timeout=10)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=10)
        deadline = time.monotonic() + 5
        while process_group(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.1)
        if process_group(proc.pid):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
        os.close(to_chrome_w)
        os.close(from_chrome_r)
        for _ in range(50):
            if not process_group(proc.pid):
                break
            time.sleep(0.1)
    assert not process_group(proc.pid), "Chromium processes left behind"


class Tab:
    """One page target, attached in flat mode, with Page/Runtime/Log/Network events on."""

    def __init__(self, devtools: DevTools) -> None:
        self.devtools = devtools
        target = devtools.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = devtools.call("Target.attachToTarget", targetId=target, flatten=True)[
            "sessionId"
        ]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable")

    def call(self, method: str, **params):
        return self.devtools.call(method, self.session, **params)

    def open(self, url: str) -> None:
        self.call("Page.navigate", url=url)
        self.devtools.wait_for("Page.loadEventFired", self.session)

    def js(self, expression: str):
        result = self.call("Runtime.evaluate", expression=expression, returnByValue=True)
        assert "exceptionDetails" not in result, result["exceptionDetails"]
        return result["result"].get("value")

    def _centre(self, selector: str) -> tuple[float, float]:
        return self.js(
            f"(() => {{ const e = document.querySelector({json.dumps(selector)});"
            " e.scrollIntoView({block: 'center'}); const r = e.getBoundingClientRect();"
            " return [r.x + r.width / 2, r.y + r.height / 2]; })()"
        )

    def hover(self, selector: str) -> None:
        x, y = self._centre(selector)
        self.call("Input.dispatchMouseEvent", type="mouseMoved", x=x, y=y)

    def click(self, selector: str) -> None:
        """A real mouse click (moved, pressed, released) at the centre of the element."""
        x, y = self._centre(selector)
        for kind in ("mouseMoved", "mousePressed", "mouseReleased"):
            self.call("Input.dispatchMouseEvent", type=kind, x=x, y=y, button="left", clickCount=1)

    def events(self, *methods: str) -> list[dict]:
        return [
            e
            for e in self.devtools.events
            if e.get("sessionId") == self.session and e.get("method") in methods
        ]

    def errors(self) -> list[dict]:
        """Uncaught exceptions, and console or log entries at level error (or a failed
        console.assert), since the tab was opened."""
        console = [
            e
            for e in self.events("Runtime.consoleAPICalled", "Log.entryAdded")
            if e["params"].get("type") in ("error", "assert")
            or e["params"].get("entry", {}).get("level") == "error"
        ]
        return self.events("Runtime.exceptionThrown") + console

    def requested_urls(self) -> list[str]:
        """Every URL the tab asked for since it was opened."""
        return [e["params"]["request"]["url"] for e in self.events("Network.requestWillBeSent")]
