"""Fixtures: real ``permit serve`` processes on ephemeral loopback ports, in temp dirs."""

from __future__ import annotations

import os
import subprocess
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Callable, Dict, Iterator, List, Optional

import httpx
import pytest

REPO = Path(__file__).resolve().parents[3]
START_TIMEOUT = 30.0
CLUSTER_SECRET = "permit-python-test-cluster-secret"


def unavailable(why: str) -> None:
    """Skips the test because the machine lacks something it needs, or fails it under
    ``PERMIT_REQUIRE_PYTHON=1`` (CI), where the whole suite must run."""
    if os.environ.get("PERMIT_REQUIRE_PYTHON") == "1":
        pytest.fail(f"PERMIT_REQUIRE_PYTHON=1 but this test cannot run: {why}")
    pytest.skip(why)


def permit_bin() -> str:
    path = os.environ.get("PERMIT_BIN") or str(REPO / "target" / "debug" / "permit")
    if not os.path.exists(path):
        pytest.exit(f"no permit binary at {path}: set PERMIT_BIN", returncode=2)
    return path


class Server:
    """One ``permit serve`` child process; ``kill9`` ends it by its PID."""

    def __init__(self, data_dir: Path, extra: List[str], listen: str = "127.0.0.1:0") -> None:
        self.log = open(data_dir.parent / f"{data_dir.name}.log", "ab")
        self.proc = subprocess.Popen(
            [permit_bin(), "serve", "--listen", listen, "--data-dir", str(data_dir), *extra],
            stdout=subprocess.PIPE,
            stderr=self.log,
            env={**os.environ, "RUST_LOG": os.environ.get("RUST_LOG", "warn,openraft=off")},
        )
        found: Dict[str, str] = {}
        ready = threading.Event()

        def read() -> None:
            assert self.proc.stdout is not None
            for raw in self.proc.stdout:  # drain until exit so the pipe never fills
                line = raw.decode(errors="replace")
                if not ready.is_set() and line.startswith("permit listening on "):
                    found["url"] = line.split()[3]
                    ready.set()

        threading.Thread(target=read, daemon=True).start()
        if not ready.wait(START_TIMEOUT):
            self.kill9()
            raise RuntimeError("permit serve did not print its address in time")
        self.url = found["url"]
        self.addr = self.url.split("://", 1)[1]

    def kill9(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
        self.log.close()


def eventually(check: Callable[[], bool], timeout: float = 10.0, pause: float = 0.01) -> bool:
    """Polls ``check`` until true or ``timeout`` passes (bounded)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(pause)
    return check()


def metrics(url: str) -> Dict[str, float]:
    """``/metrics`` as ``{"name{labels}": value}``."""
    text = httpx.get(url + "/metrics", timeout=5.0, trust_env=False).text
    out: Dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            out[key] = float(value)
    return out


def metric_sum(values: Dict[str, float], prefix: str, *must: str) -> float:
    return sum(v for k, v in values.items() if k.startswith(prefix) and all(m in k for m in must))


@pytest.fixture(scope="session")
def server() -> Iterator[Server]:
    with tempfile.TemporaryDirectory(prefix="permit-py-") as temp:
        node = Server(Path(temp) / "data", [])
        try:
            yield node
        finally:
            node.kill9()


@pytest.fixture
def name() -> str:
    return "py." + uuid.uuid4().hex[:12]


class Cluster:
    def __init__(self, temp: Path, size: int = 3) -> None:
        secret = temp / "cluster.secret"
        secret.write_text(CLUSTER_SECRET)
        self.nodes: List[Server] = []
        try:
            for i in range(1, size + 1):
                args = ["--id", str(i), "--join", "--cluster-secret-file", str(secret)]
                self.nodes.append(Server(temp / f"n{i}", args))
            members = [{"id": i + 1, "addr": n.addr} for i, n in enumerate(self.nodes)]
            answer = httpx.post(self.nodes[0].url + "/v1/cluster/init", json={"members": members}, timeout=10.0, trust_env=False)
            assert answer.status_code < 300, answer.text
            assert self.leader(10.0) is not None, "no leader elected"
        except BaseException:
            self.stop()
            raise

    def urls(self) -> List[str]:
        return [n.url for n in self.nodes]

    def leader(self, timeout: float) -> Optional[int]:
        found: List[int] = []

        def check() -> bool:
            for i, node in enumerate(self.nodes):
                if node.proc.poll() is not None:
                    continue
                try:
                    health = httpx.get(node.url + "/v1/health", timeout=0.5, trust_env=False).json()
                except (httpx.HTTPError, ValueError):
                    continue
                if health.get("raft_role") == "leader":
                    found.append(i)
                    return True
            return False

        return found[-1] if eventually(check, timeout, 0.02) else None

    def stop(self) -> None:
        for node in self.nodes:
            node.kill9()


@pytest.fixture
def cluster() -> Iterator[Cluster]:
    with tempfile.TemporaryDirectory(prefix="permit-py-cluster-") as temp:
        nodes = Cluster(Path(temp))
        try:
            yield nodes
        finally:
            nodes.stop()


def own_server(temp: str, env: Optional[Dict[str, str]] = None) -> Server:
    """A server of the test's own (its metrics count only what the test did); ``env`` is set
    for its start (``PERMIT_INJECT_BUG`` works with a test build of the binary)."""
    saved = {key: os.environ.get(key) for key in env or {}}
    os.environ.update(env or {})
    try:
        return Server(Path(temp) / "data", [])
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


class KeepaliveCounts:
    """What a server saw of keepalives: sessions renewed (``permit_session_keepalives_total``),
    requests to either keepalive route, and batched requests that were answered 2xx."""

    def __init__(self, url: str) -> None:
        values = metrics(url)
        self.renewals = metric_sum(values, "permit_session_keepalives_total")
        self.requests = metric_sum(values, "permit_http_requests_total", "keepalive")
        self.single = metric_sum(values, "permit_http_requests_total", "/v1/sessions/{id}/keepalive")
        self.batch_refused = metric_sum(values, "permit_http_requests_total", 'route="/v1/sessions/keepalive"', 'status="405"')
        self.batched = values.get("permit_session_keepalive_batch_sessions_count", 0.0)

    def __repr__(self) -> str:
        return f"KeepaliveCounts({self.__dict__})"


def batch_route_refused(url: str) -> bool:
    """Whether the server answers the batched keepalive 405, as servers before it did."""
    answer = httpx.post(url + "/v1/sessions/keepalive", json={"sessions": []}, timeout=5.0, trust_env=False)
    return answer.status_code == 405
