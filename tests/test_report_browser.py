"""The HTML reports in a real browser: headless Chromium opens each page from disk (file://) and, over the
DevTools protocol on a pipe, tells whether every figure rendered, whether anything was logged as an error,
and which requests the page made. Skipped where no Chromium is installed (Debian: apt-get install chromium)."""

import json
import os
import select
import shutil
import subprocess
import tempfile
import time

import pytest

from test_run_report import _slide_like
from hwrepro.harness import records
from hwrepro.study import report

BROWSER = next(filter(None, map(shutil.which, ("chromium", "chromium-browser", "google-chrome"))), None)
pytestmark = pytest.mark.skipif(BROWSER is None, reason="no Chromium to open the reports in: apt-get install "
                                                        "chromium (the README's test section)")

# Every <img> and <svg> inside a <figure>: loaded and drawn with a size (an <svg> with something in it).
FIGURES = """JSON.stringify(Array.from(document.querySelectorAll('figure img, figure svg')).map(e =>
  e.tagName === 'IMG' ? e.complete && e.naturalWidth > 0
                      : e.getBoundingClientRect().width > 0 && e.querySelectorAll('polyline, rect').length > 0))"""


class Browser:
    """Headless Chromium driven over --remote-debugging-pipe (fd 3: commands in, fd 4: replies out)."""

    def __init__(self):
        to_chrome, self._write = os.pipe()
        self._read, from_chrome = os.pipe()
        self._profile = tempfile.mkdtemp()

        def pipes():  # in the child, before exec: the protocol's fixed descriptors
            a, b = os.dup(to_chrome), os.dup(from_chrome)
            os.dup2(a, 3)
            os.dup2(b, 4)

        self.process = subprocess.Popen(
            [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
             "--disable-background-networking", "--disable-component-update", "--disable-sync",
             "--remote-debugging-pipe", f"--user-data-dir={self._profile}", "about:blank"],
            preexec_fn=pipes, close_fds=False, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(to_chrome)
        os.close(from_chrome)
        self._id, self._buffer, self.events = 0, b"", []
        target = self.call("Target.createTarget", url="about:blank")["targetId"]
        self.session = self.call("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]
        for domain in ("Page", "Runtime", "Log", "Network"):
            self.call(f"{domain}.enable", session=True)

    def _message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if not select.select([self._read], [], [], max(deadline - time.time(), 0))[0]:
                raise TimeoutError("the browser did not answer")
            self._buffer += os.read(self._read, 1 << 20)
        line, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(line)

    def call(self, method: str, session: bool = False, timeout: float = 30, **params) -> dict:
        self._id += 1
        message = {"id": self._id, "method": method, "params": params}
        if session:
            message["sessionId"] = self.session
        os.write(self._write, json.dumps(message).encode() + b"\0")
        deadline = time.time() + timeout
        while True:
            reply = self._message(deadline)
            if reply.get("id") == self._id:
                assert "error" not in reply, reply
                return reply["result"]
            self.events.append(reply)

    def wait_for(self, method: str, timeout: float = 30) -> None:
        deadline = time.time() + timeout
        while not any(e.get("method") == method for e in self.events):
            self.events.append(self._message(deadline))

    def open(self, path) -> tuple[list[bool], list[str], list[str]]:
        """(figures rendered, error messages, requested URLs) of the page at `path`."""
        self.events = []
        self.call("Page.navigate", session=True, url=path.as_uri())
        self.wait_for("Page.loadEventFired")
        rendered = json.loads(self.call("Runtime.evaluate", session=True, expression=FIGURES,
                                        returnByValue=True)["result"]["value"])
        errors = [json.dumps(e["params"])[:300] for e in self.events
                  if e.get("method") == "Runtime.exceptionThrown"
                  or (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "warning"))
                  or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] in ("error", "warning"))]
        urls = [e["params"]["request"]["url"] for e in self.events if e.get("method") == "Network.requestWillBeSent"]
        return rendered, errors, urls

    def close(self) -> None:
        try:
            self.call("Browser.close", timeout=5)
        except (TimeoutError, OSError):
            pass
        self.process.kill()
        self.process.wait()
        shutil.rmtree(self._profile, ignore_errors=True)


@pytest.fixture
def browser():
    b = Browser()
    yield b
    b.close()


def _sweep(workdir):
    """A sweep folder by hand: configurations ref and b, 3 seeds each, with loss curves (so every PNG plot the
    sweep report draws from final values and curves is there)."""
    points = []
    for c, shift in (("ref", 0.0), ("b", 0.1)):
        for seed in range(3):
            name = f"cfg={c},seed={seed}"
            (workdir / name).mkdir(parents=True)
            records.write_json_atomic(workdir / name / "run.json", {"status": "done", "name": name})
            records.write_json_atomic(workdir / name / "final.json", {"test_loss": 1.0 + shift + seed / 10,
                                                                      "wall_seconds": 1.0, "param_sha256": name})
            (workdir / name / "metrics.jsonl").write_text("".join(
                json.dumps({"step": s, "loss": 1 / s + shift}) + "\n" for s in (1, 2, 3)))
            points.append({"name": name, "overrides": {"cfg": c, "seed": seed}, "configuration": f"cfg={c}"})
    records.write_json_atomic(workdir / "sweep.json", {"experiment": "autoencoder", "name": "hand", "points": points,
                                                       "report": {"reference": "cfg=ref"}, "group_over": ["seed"]})
    report.write_report(workdir)
    return workdir / "report.html"


def test_reports_render_every_figure_with_no_error_and_no_request_off_the_machine(tmp_path, browser):
    runs = [_slide_like(tmp_path / "lsh", "lsh", (0.1, 0.2, 0.3), 0.1),
            _slide_like(tmp_path / "dense", "dense", (0.15, 0.25, 0.35), 10.0)]
    overlay = tmp_path / "both.html"
    assert report.main(["--html", *map(str, runs), "--out", str(overlay)]) == 0
    sweep = _sweep(tmp_path / "sweep")
    for page, count in ((overlay, 5), (sweep, sweep.read_text().count("<img"))):  # the sweep: one per PNG
        rendered, errors, urls = browser.open(page)
        assert count >= 2 and rendered == [True] * count, (page, rendered)
        assert errors == [], errors
        assert all(u == page.as_uri() or u.startswith("data:") for u in urls), urls
