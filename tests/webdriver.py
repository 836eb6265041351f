"""A headless Chromium driven over the W3C WebDriver HTTP API (``chromedriver``), for page tests.
Skips the test, with the reason, where Debian's ``chromium`` and ``chromium-driver`` are missing."""

from __future__ import annotations

import base64
import shutil
import subprocess
import time
from typing import Any

import httpx
import pytest

from pqrl.redis_server import free_port

ELEMENT = "element-6066-11e4-a52e-4f735466cecf"  # the W3C key of an element reference


class Browser:
    def __init__(self) -> None:
        driver, chromium = shutil.which("chromedriver"), shutil.which("chromium")
        if driver is None or chromium is None:
            pytest.skip("no chromium / chromedriver: scripts/setup.sh installs them as root (apt)")
        port = free_port()
        self.proc = subprocess.Popen([driver, f"--port={port}"], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)  # fmt: skip
        self.http = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60)
        try:
            self._wait_ready()
            args = ["--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--window-size=1400,1000"]  # fmt: skip
            caps = {"browserName": "chrome", "goog:chromeOptions": {"binary": chromium, "args": args}}
            self.session = self._call("POST", "/session", {"capabilities": {"alwaysMatch": caps}})[
                "sessionId"
            ]
        except BaseException:
            self.close()
            raise

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                if self.http.get("/status").json()["value"]["ready"]:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError("chromedriver did not start")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        r = self.http.request(method, path, json=body)
        value = r.json()["value"]
        if r.status_code != 200:
            raise RuntimeError(f"webdriver {path}: {value}")
        return value

    def _s(self, path: str, body: Any = None, method: str = "POST") -> Any:
        return self._call(method, f"/session/{self.session}{path}", body)

    def get(self, url: str) -> None:
        self._s("/url", {"url": url})

    def all(self, css: str) -> list[str]:
        found = self._s("/elements", {"using": "css selector", "value": css})
        return [e[ELEMENT] for e in found]

    def wait(self, css: str, timeout: float = 20) -> list[str]:
        """The elements matching ``css`` once there is one."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if found := self.all(css):
                return found
            time.sleep(0.1)
        raise AssertionError(
            f"no {css!r} on the page; it shows: {self.js('return document.body.innerText')[:500]}"
        )

    def text(self, el: str) -> str:
        return self._s(f"/element/{el}/text", method="GET")

    def attr(self, el: str, name: str) -> str | None:
        return self._s(f"/element/{el}/attribute/{name}", method="GET")

    def click(self, el: str) -> None:
        self._s(f"/element/{el}/click", {})

    def hover(self, el: str) -> None:
        self._s("/actions", {"actions": [{"type": "pointer", "id": "mouse", "actions": [
            {"type": "pointerMove", "origin": {ELEMENT: el}, "x": 0, "y": 0}]}]})  # fmt: skip

    def js(self, script: str, *args: Any) -> Any:
        return self._s("/execute/sync", {"script": script, "args": list(args)})

    def screenshot(self) -> bytes:
        return base64.b64decode(self._s("/screenshot", method="GET"))

    def close(self) -> None:
        try:
            if getattr(self, "session", None):
                self.http.delete(f"/session/{self.session}")
        finally:
            self.http.close()
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
