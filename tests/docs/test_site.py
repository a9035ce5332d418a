"""The docs site as a reader sees it (make docs, after `mkdocs build --strict` wrote build/site):
served on loopback and opened in headless Chromium, the home page, the API reference and a search
render. Screenshots are left in build/site-shots/ for a person to look at."""

from __future__ import annotations

import asyncio
import base64
import functools
import http.server
import json
import os
import re
import shutil
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from PIL import Image

import stoker

ROOT = Path(__file__).resolve().parents[2]
SITE = ROOT / "build" / "site"
SHOTS = ROOT / "build" / "site-shots"
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")

pytestmark = [
    pytest.mark.skipif(CHROMIUM is None, reason="no headless chromium (make setup installs it)"),
    pytest.mark.skipif(not (SITE / "index.html").exists(), reason="no build/site: run make docs"),
]


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """build/site over HTTP on loopback (the search runs in a web worker, which file:// forbids)."""
    handler = functools.partial(_QuietHandler, directory=str(SITE))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        thread.join(10)
        server.server_close()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format: str, *args: object) -> None:  # noqa: A002
        pass


class Browser:
    """Headless Chromium driven over the DevTools protocol (aiohttp's websocket): a page is
    loaded, then waited on until a condition written in JavaScript holds, in real time, so that
    the search's web worker has built its index (the command line's --virtual-time-budget does
    not run workers)."""

    def __init__(self, tmp: Path) -> None:
        assert CHROMIUM is not None
        self.process = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
             "--window-size=1280,1600", "--remote-debugging-port=0", f"--user-data-dir={tmp}",
             "about:blank"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
            env={k: v for k, v in os.environ.items() if k != "LD_PRELOAD"},
        )  # fmt: skip
        assert self.process.stderr is not None
        for line in self.process.stderr:  # "DevTools listening on ws://127.0.0.1:PORT/..."
            if "DevTools listening on" in line:
                self.port = int(re.search(r":(\d+)/", line).group(1))  # type: ignore[union-attr]
                break
        else:
            raise AssertionError("chromium did not start its DevTools server")
        self.loop = asyncio.new_event_loop()

    def close(self) -> None:
        self.process.terminate()
        self.process.wait(30)
        self.loop.close()

    def open(self, url: str, until: str, shot: str) -> Any:
        """Loads `url`, waits (30 s at most) for `until` to be truthy, saves a screenshot as
        build/site-shots/SHOT.png and returns what `until` gave."""
        return self.loop.run_until_complete(asyncio.wait_for(self._open(url, until, shot), 60))

    async def _open(self, url: str, until: str, shot: str) -> Any:
        import aiohttp

        async with aiohttp.ClientSession() as http:
            async with http.put(f"http://127.0.0.1:{self.port}/json/new?about:blank") as r:
                target = await r.json(content_type=None)
            async with http.ws_connect(target["webSocketDebuggerUrl"], max_msg_size=0) as ws:
                ids = iter(range(1, 1 << 30))

                async def call(method: str, **params: Any) -> Any:
                    n = next(ids)
                    await ws.send_json({"id": n, "method": method, "params": params})
                    async for message in ws:
                        reply = json.loads(message.data)
                        if reply.get("id") == n:
                            assert "error" not in reply, reply
                            return reply["result"]
                    raise AssertionError("the DevTools connection closed")

                await call("Emulation.setDeviceMetricsOverride", width=1280, height=1600,
                           deviceScaleFactor=1, mobile=False)  # fmt: skip
                await call("Page.navigate", url=url)
                value = None
                for _ in range(300):
                    result = await call("Runtime.evaluate", expression=until, returnByValue=True)
                    value = result["result"].get("value")
                    if value:
                        break
                    await asyncio.sleep(0.1)
                SHOTS.mkdir(parents=True, exist_ok=True)
                png = await call("Page.captureScreenshot", format="png")
                (SHOTS / f"{shot}.png").write_bytes(base64.b64decode(png["data"]))
                return value


@pytest.fixture(scope="module")
def browser(tmp_path_factory) -> Iterator[Browser]:
    b = Browser(tmp_path_factory.mktemp("chromium"))
    try:
        yield b
    finally:
        b.close()


def _shot(name: str) -> np.ndarray:
    image = np.asarray(Image.open(SHOTS / f"{name}.png").convert("RGB")).astype(int)
    assert image.shape == (1600, 1280, 3), image.shape
    return image


HEADER = (0xFF, 0x6E, 0x42)  # the header's deep orange, as Chromium paints it


def _near(image: np.ndarray, rgb: tuple[int, int, int]) -> int:
    return int((np.abs(image - np.array(rgb)).sum(axis=2) < 40).sum())


def test_the_home_page_renders_the_readme_with_its_chart(site, browser):
    page = browser.open(site + "/", """document.readyState == "complete" && {
        title: document.querySelector("h1").textContent,
        charts: [...document.images].filter(i => i.src.endsWith(".svg"))
                                   .map(i => [i.getAttribute("src"), i.naturalWidth]),
        text: document.querySelector("article").innerText,
        links: [...document.querySelectorAll("article a")].map(a => a.href)}""", "home")
    assert page["title"].startswith("stoker"), page["title"]
    assert page["charts"] and all(width > 0 for _, width in page["charts"]), page["charts"]
    assert "pip install stoker" in page["text"]
    # Every link of the page into the site lands on a built page.
    own = {u.split("#")[0] for u in page["links"] if u.startswith(site)}
    assert own, page["links"]
    for url in own:
        path = SITE / url[len(site) :].lstrip("/")
        assert (path / "index.html" if url.endswith("/") else path).exists(), url
    image = _shot("home")
    assert _near(image, (255, 255, 255)) > 0.3 * image.shape[0] * image.shape[1]  # a page
    assert _near(image, HEADER) > 5000  # Material's deep-orange header


def test_the_api_page_documents_every_public_name(site, browser):
    page = browser.open(site + "/reference/api/", """document.readyState == "complete" && {
        headings: [...document.querySelectorAll("article h3[id]")].map(h => h.id),
        text: document.querySelector("article").innerText}""", "api")
    names = {h.rsplit(".", 1)[-1] for h in page["headings"]}
    assert set(stoker.__all__) <= names, sorted(set(stoker.__all__) - names)
    # Signatures and docstrings, not only names: ImageLoader's arguments and what on_error does.
    for words in ("batch_size", "on_error", "ErrorBudgetExceededError"):
        assert words in page["text"], words
    cli = browser.open(site + "/reference/cli/",
                       'document.readyState == "complete" && document.body.innerText', "cli")
    for command in ("pack", "inspect", "verify", "bench", "doctor", "trace", "show"):
        assert f"usage: stoker {command}" in cli, command


def test_a_search_finds_pages(site, browser):
    """Material's search, in its web worker, from the ?q= of a shared search link."""
    results = browser.open(site + "/?q=quarantine", """[...document.querySelectorAll(
        ".md-search-result__item a")].map(a => a.href)""", "search")
    assert results, "no search results rendered"
    assert any("RELIABILITY" in r for r in results), results
    assert any("reference/api" in r for r in results), results  # the docstrings are indexed
    image = _shot("search")
    # The results' white panel over the darkened page, the page's header dimmed behind it.
    assert _near(image[100:1000, 600:1200], (255, 255, 255)) > 0.4 * 900 * 600
    assert _near(image, HEADER) < 1000
