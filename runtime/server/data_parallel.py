"""`radixflow serve --dp-size N`: N engine replicas on this machine behind SGLang's router.

    client ──► sglang-router (--host:--port, cache-aware) ──┬──► dp0: radixflow serve 127.0.0.1:p0
                                                            ├──► dp1: radixflow serve 127.0.0.1:p1
                                                            └──► ...

Each replica is a whole `radixflow serve` process (its own engine, KV pool and radix cache) on
a loopback port; the router (`python -m sglang_router.launch_router`, the `router` extra) sends
each request to the replica whose cache already holds the longest part of its prompt. This
process only supervises: it starts the replicas, waits for each one's /health, starts the
router, prefixes each child's output with its name, forwards SIGINT/SIGTERM, and when any
child dies stops the others and exits non-zero naming it. Children die with it (Linux's
parent-death signal), so none is orphaned.
"""

from __future__ import annotations

import ctypes
import importlib.util
import logging
import os
import selectors
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import httpx

logger = logging.getLogger(__name__)

ROUTER_EXTRA = "pip install 'radixflow[router]'"
STARTUP_TIMEOUT_S = 1800.0  # the router's own default wait for a worker to come up
_POLL_S = 0.2
# the router one step quieter than the replicas: its info level logs every workflow step
_ROUTER_LOG_LEVELS = {"debug": "debug", "info": "warn", "warning": "warn"}


@dataclass(frozen=True)
class ReplicaPlan:
    """What the supervisor starts: N worker command lines, then the router in front."""

    dp_size: int
    host: str
    port: int
    worker_argv: list[str]  # `radixflow serve ...` as the user gave it
    num_threads: int | None  # --num-threads as given (None: split the cores)
    device: str
    mem_fraction_static: float
    api_key: str | None = None
    cors_origins: list[str] | None = None
    log_level: str = "info"
    graceful_timeout: float = 30.0

    def threads_per_replica(self) -> int | None:
        """torch intra-op threads of each replica: the user's, else this process's cores / N."""
        if self.num_threads is not None:
            return None  # already in worker_argv
        return max(1, available_cores() // self.dp_size)

    def worker_command(self, port: int, shares_memory: bool) -> list[str]:
        """One replica's `radixflow serve`; replicas sharing one memory (the CPU's) each take
        their share of --mem-fraction-static."""
        # argparse keeps the last value of a repeated option: these override the user's
        cmd = [sys.executable, "-m", "radixflow", *self.worker_argv]
        cmd += ["--host", "127.0.0.1", "--port", str(port), "--dp-size", "1"]
        threads = self.threads_per_replica()
        if threads is not None:
            cmd += ["--num-threads", str(threads)]
        if shares_memory:
            cmd += ["--mem-fraction-static", f"{self.mem_fraction_static / self.dp_size:.6g}"]
        return cmd

    def router_command(self, worker_urls: list[str], prometheus_port: int) -> list[str]:
        cmd = [sys.executable, "-m", "sglang_router.launch_router", "--policy", "cache_aware"]
        cmd += ["--host", self.host, "--port", str(self.port), "--worker-urls", *worker_urls]
        cmd += ["--prometheus-host", self.host, "--prometheus-port", str(prometheus_port)]
        cmd += ["--log-level", _ROUTER_LOG_LEVELS.get(self.log_level, "error")]
        cmd += ["--shutdown-grace-period-secs", str(max(1, round(self.graceful_timeout)))]
        if self.api_key is not None:  # the router checks clients' key and sends it to workers
            cmd += ["--api-key", self.api_key]
        if self.cors_origins:
            cmd += ["--cors-allowed-origins", *self.cors_origins]
        return cmd


def check_router_installed(dp_size: int) -> None:
    if importlib.util.find_spec("sglang_router") is None:
        raise ValueError(
            f"--dp-size {dp_size} puts SGLang's router in front of the replicas, and "
            f"sglang_router is not installed: {ROUTER_EXTRA}"
        )


def replica_gpus(device: str, dp_size: int) -> list[str] | None:
    """CUDA_VISIBLE_DEVICES of each replica (one GPU each), or None when they run on the CPU."""
    if device == "cpu":  # no torch import in this process
        return None
    from radixflow.runtime.model_runner import resolve_device

    if resolve_device(device).type != "cuda":
        return None
    if ":" in device:
        raise ValueError(
            f"--device {device} pins every replica to one GPU; give --device cuda and each "
            "replica takes its own"
        )
    import torch

    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = visible.split(",") if visible else [str(i) for i in range(torch.cuda.device_count())]
    if len(ids) < dp_size:
        raise ValueError(
            f"--dp-size {dp_size} needs one GPU per replica and {len(ids)} are visible; use "
            "fewer replicas or --device cpu"
        )
    return ids[:dp_size]


@dataclass
class _Child:
    name: str
    proc: subprocess.Popen[bytes]
    url: str
    partial: bytes = b""  # output after its last newline

    def describe(self) -> str:
        return f"{self.name} (pid {self.proc.pid}, {self.url})"


class ChildExited(RuntimeError):
    """A replica or the router exited while the others ran."""


@dataclass
class Supervisor:
    """Starts the replicas and the router, relays their output, stops them all together."""

    plan: ReplicaPlan
    children: list[_Child] = field(default_factory=list)
    stop_signal: int | None = None
    _selector: selectors.DefaultSelector = field(default_factory=selectors.DefaultSelector)

    def run(self) -> int:
        """Serve until SIGINT/SIGTERM (exit 0) or until a child dies (exit 1)."""
        gpus = replica_gpus(self.plan.device, self.plan.dp_size)
        previous = {s: signal.signal(s, self._on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            ports = free_ports("127.0.0.1", self.plan.dp_size)
            for i, port in enumerate(ports):
                env = None if gpus is None else {**os.environ, "CUDA_VISIBLE_DEVICES": gpus[i]}
                url = f"http://127.0.0.1:{port}"
                cmd = self.plan.worker_command(port, shares_memory=gpus is None)
                self._start(f"dp{i}", cmd, url, env)
            workers = list(self.children)
            if not self._wait(lambda: all(self._healthy(c.url) for c in workers)):
                return 0
            urls = [c.url for c in workers]
            prometheus = free_ports(self.plan.host, 1)[0]
            router_url = f"http://{_connect_host(self.plan.host)}:{self.plan.port}"
            self._start("router", self.plan.router_command(urls, prometheus), router_url, None)
            if not self._wait(lambda: self._router_ready(router_url)):
                return 0
            logger.info(
                "serving %d replicas behind sglang-router (cache_aware) on http://%s:%d "
                "(router metrics on port %d); replicas: %s",
                self.plan.dp_size, self.plan.host, self.plan.port, prometheus, " ".join(urls),
            )  # fmt: skip
            self._wait(lambda: False)
            return 0
        except (ChildExited, TimeoutError) as exc:
            logger.error("%s; stopping the others", exc)
            return 1
        finally:
            self._stop_all()
            for sig, handler in previous.items():
                signal.signal(sig, handler)

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stop_signal = signum

    def _start(self, name: str, cmd: list[str], url: str, env: dict[str, str] | None) -> None:
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,  # a terminal's Ctrl-C reaches only us; we forward it once
            preexec_fn=die_with_parent,
        )
        child = _Child(name, proc, url)
        assert proc.stdout is not None
        os.set_blocking(proc.stdout.fileno(), False)
        self._selector.register(proc.stdout, selectors.EVENT_READ, child)
        self.children.append(child)

    def _wait(self, ready: Callable[[], bool]) -> bool:
        """Relay output until `ready()` (True) or a stop signal (False); raise when a child
        exits or the startup time runs out."""
        deadline = time.monotonic() + STARTUP_TIMEOUT_S
        while self.stop_signal is None:
            self._relay(_POLL_S)
            for child in self.children:
                code = child.proc.poll()
                if code is not None:
                    raise ChildExited(f"{child.describe()} exited with code {code}")
            if ready():
                return True
            if time.monotonic() > deadline:
                raise TimeoutError(f"not ready after {STARTUP_TIMEOUT_S:.0f} s")
        return False

    def _relay(self, timeout: float) -> None:
        """Copy the children's complete output lines to our stderr, each with its name."""
        for key, _ in self._selector.select(timeout):
            child: _Child = key.data
            try:
                data = os.read(key.fd, 65536)
            except BlockingIOError:
                continue
            if not data:
                self._selector.unregister(key.fileobj)
                data = b"\n" if child.partial else b""
            *lines, child.partial = (child.partial + data).split(b"\n")
            for line in lines:
                sys.stderr.buffer.write(f"[{child.name}] ".encode() + line + b"\n")
            sys.stderr.buffer.flush()

    def _healthy(self, url: str) -> bool:
        try:
            return httpx.get(f"{url}/health", timeout=2).status_code == 200
        except httpx.TransportError:
            return False

    def _router_ready(self, url: str) -> bool:
        headers = {"Authorization": f"Bearer {self.plan.api_key}"} if self.plan.api_key else {}
        try:
            r = httpx.get(f"{url}/get_loads", headers=headers, timeout=2)
        except httpx.TransportError:
            return False
        return r.status_code == 200 and len(r.json().get("workers", [])) == self.plan.dp_size

    def _stop_all(self) -> None:
        """SIGTERM to every child still running (the router and replicas drain in-flight
        requests for --graceful-timeout), then SIGKILL whatever outlives that."""
        running = [c for c in self.children if c.proc.poll() is None]
        for child in running:
            child.proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + self.plan.graceful_timeout + 15
        while any(c.proc.poll() is None for c in running) and time.monotonic() < deadline:
            self._relay(_POLL_S)
        for child in running:
            if child.proc.poll() is None:
                logger.warning("%s did not stop; killing it", child.describe())
                child.proc.kill()
                child.proc.wait()
        self._relay(0)
        self._selector.close()
        for child in self.children:
            if child.proc.stdout is not None:
                child.proc.stdout.close()


def available_cores() -> int:
    """CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def free_ports(host: str, n: int) -> list[int]:
    """n distinct ports free on `host` now (held together while chosen, so distinct)."""
    family = socket.getaddrinfo(host, 0, type=socket.SOCK_STREAM)[0][0]
    socks = [socket.socket(family) for _ in range(n)]
    try:
        for s in socks:
            s.bind((host, 0))
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def _connect_host(host: str) -> str:
    """Where this process reaches a server bound to `host` (a wildcard: loopback), as a URL
    writes it."""
    host = {"0.0.0.0": "127.0.0.1", "::": "::1", "": "127.0.0.1"}.get(host, host)
    return f"[{host}]" if ":" in host else host


def die_with_parent() -> None:
    """In the child, before exec: SIGTERM when the supervisor dies, however it dies (Linux)."""
    if sys.platform.startswith("linux"):
        pr_set_pdeathsig = 1
        ctypes.CDLL(None, use_errno=True).prctl(pr_set_pdeathsig, signal.SIGTERM)
