"""A radixflow server on 127.0.0.1 (a free port) in a background thread, for the server tests.

Test modules load this as a plugin (`pytest_plugins = ["server_harness"]`) for its fixtures,
and import its plain helpers (`sse_events`, `wait_idle`, `kv_all_free`).
"""

from __future__ import annotations

import socket
import subprocess
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx
import pytest
import uvicorn

import radixflow as rf
from radixflow.runtime.server.app import create_app


def sse_events(lines):
    """The data payloads of a server-sent event stream."""
    for line in lines:
        if line.startswith("data: "):
            yield line[len("data: ") :]


def wait_idle(engine, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while engine.scheduler.running or engine.scheduler.waiting:
        assert time.monotonic() < deadline, "the engine still has requests"
        time.sleep(0.02)


def kv_all_free(http, engine) -> None:
    """No request left and, once the prefix cache is emptied, every KV page free."""
    wait_idle(engine)
    assert http.post("/flush_cache").status_code == 200
    assert engine.kv_pages_free() == engine.kv_pages_total()


@dataclass
class RunningServer:
    url: str
    app: Any
    server: uvicorn.Server
    thread: threading.Thread

    def stop(self) -> None:
        self.server.should_exit = True
        self.thread.join(timeout=30)


def start_server(engine: Any, **app_kwargs: Any) -> RunningServer:
    """Serve `create_app(engine, **app_kwargs)`; returns once /health answers 200."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    app_kwargs.setdefault("served_model_name", "m")  # the `model` the server tests send
    app = create_app(engine, **app_kwargs)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=5)
    server = uvicorn.Server(config)
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if server.started and httpx.get(f"{url}/health").status_code == 200:
            return RunningServer(url, app, server, thread)
        time.sleep(0.05)
    server.should_exit = True
    raise RuntimeError("the test server did not become ready")


@pytest.fixture(scope="session")
def engine():
    """One float32 default-model engine shared by the server test modules."""
    eng = rf.Engine(dtype="float32", max_total_tokens=4096, chunked_prefill_size=256)
    yield eng
    eng.shutdown()


@pytest.fixture(scope="session")
def server(engine):
    running = start_server(engine)
    yield running
    running.stop()


@pytest.fixture
def server_factory(engine):
    """Start extra servers over the shared engine (`server_factory(api_key=...)`); they stop
    when the test ends."""
    started: list[RunningServer] = []

    def start(**app_kwargs: Any) -> RunningServer:
        started.append(start_server(engine, **app_kwargs))
        return started[-1]

    yield start
    for running in started:
        running.stop()


@pytest.fixture
def http(server):
    with httpx.Client(base_url=server.url, timeout=60) as client:
        yield client


def wait_healthy(
    proc: subprocess.Popen, url: str, timeout: float, output: Callable[[], str] = lambda: ""
) -> None:
    """Poll `url`/health until it answers 200; fail with `output()` (what the server printed)
    if the process exits first, or when `timeout` seconds pass."""
    deadline = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, output()
        assert time.monotonic() < deadline, f"{url} did not answer /health in {timeout} s"
        try:
            if httpx.get(f"{url}/health", timeout=1).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.2)
