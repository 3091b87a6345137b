"""SGLang's real router (`sglang_router`) in front of two `radixflow serve` worker processes on
loopback (tiny models): it registers them (health, server and model info), balances on their
/get_load, and forwards /generate and the /v1 routes with the fields it adds."""

from __future__ import annotations

import importlib.util
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import httpx
import pytest
from server_harness import wait_healthy
from tiny_models import make_tiny_model_dir
from transformers import AutoTokenizer

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("sglang_router") is None,
    reason="sglang-router is not installed (pip install sglang-router)",
)

CHAT_TEMPLATE = (
    "{% for m in messages %}{{ m['role'] }}: {{ m['content'] }}\n{% endfor %}"
    "{% if add_generation_prompt %}assistant: {% endif %}"
)
GREEDY = {"max_new_tokens": 6, "temperature": 0, "ignore_eos": True}
START_TIMEOUT = 180


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log_tail(log: Path) -> Callable[[], str]:
    """What a server started here printed last (its log file's tail), read when asked."""
    return lambda: log.read_text()[-3000:]


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    path = make_tiny_model_dir(tmp_path_factory.mktemp("router-model"), "llama", seed=0)
    tok = AutoTokenizer.from_pretrained(path)
    tok.chat_template = CHAT_TEMPLATE  # the chat route needs one
    tok.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def workers(model_dir, tmp_path_factory) -> Iterator[list[str]]:
    logs = tmp_path_factory.mktemp("router-logs")
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    procs, urls = [], []
    try:
        for i in range(2):
            port = _free_port()
            cmd = [sys.executable, "-m", "radixflow", "serve", "--model-path", str(model_dir)]
            cmd += ["--port", str(port), "--dtype", "float32", "--max-total-tokens", "1024"]
            cmd += ["--num-threads", "1", "--log-level", "warning", "--graceful-timeout", "1"]
            cmd += ["--served-model-name", "tiny"]
            log = logs / f"worker{i}.log"
            procs.append(
                subprocess.Popen(cmd, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
            )
            urls.append((f"http://127.0.0.1:{port}", log))
        for proc, (url, log) in zip(procs, urls, strict=True):
            wait_healthy(proc, url, START_TIMEOUT, log_tail(log))
        yield [url for url, _ in urls]
    finally:
        for proc in procs:
            _stop(proc)


@pytest.fixture(scope="module")
def router(workers, tmp_path_factory) -> Iterator[str]:
    port = _free_port()
    log = tmp_path_factory.mktemp("router") / "router.log"
    cmd = [sys.executable, "-m", "sglang_router.launch_router", "--host", "127.0.0.1"]
    cmd += ["--port", str(port), "--prometheus-port", str(_free_port())]
    cmd += ["--policy", "cache_aware", "--log-level", "warn", "--worker-urls", *workers]
    proc = subprocess.Popen(cmd, stdout=log.open("w"), stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, START_TIMEOUT, log_tail(log))
        deadline = time.monotonic() + START_TIMEOUT
        while len(httpx.get(f"{url}/get_loads", timeout=5).json().get("workers", [])) < 2:
            assert time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.3)
        yield url
    finally:
        _stop(proc)


def test_router_registers_both_workers_and_reads_their_load(router, workers):
    loads = httpx.get(f"{router}/get_loads", timeout=10).json()["workers"]
    assert sorted(w["worker"] for w in loads) == sorted(workers)
    # -1 would mean the router could not read a worker's /get_load.
    assert all(w["load"] >= 0 for w in loads)
    info = httpx.get(f"{router}/get_model_info", timeout=10).json()
    assert info["is_generation"] is True and info["model_type"] == "llama"


def test_generate_through_the_router_matches_a_worker(router, workers):
    body = {"text": "The quick brown fox", "sampling_params": GREEDY}
    direct = httpx.post(f"{workers[0]}/generate", json=body, timeout=60).json()
    for _ in range(3):  # whichever worker serves it: same weights, same greedy tokens
        r = httpx.post(f"{router}/generate", json=body, timeout=60)
        assert r.status_code == 200, r.text
        assert r.json()["output_ids"] == direct["output_ids"]
    # The router itself takes one prompt per /generate (it refuses a list of texts).
    ids = {"input_ids": direct["output_ids"], "sampling_params": GREEDY, "rid": "via-router"}
    r = httpx.post(f"{router}/generate", json=ids, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["meta_info"]["completion_tokens"] == 6


def test_streaming_generate_through_the_router(router):
    body = {"text": "The quick brown fox", "sampling_params": GREEDY, "stream": True}
    with httpx.stream("POST", f"{router}/generate", json=body, timeout=60) as r:
        assert r.status_code == 200
        lines = [line for line in r.iter_lines() if line.startswith("data:")]
    assert lines[-1] == "data: [DONE]" and len(lines) > 2


def test_chat_and_completions_through_the_router(router, workers):
    chat = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
    r = httpx.post(f"{router}/v1/chat/completions", json={**chat, "temperature": 0}, timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["usage"]["completion_tokens"] <= 4
    direct = httpx.post(f"{workers[1]}/v1/chat/completions", json={**chat, "temperature": 0})
    assert r.json()["choices"][0]["message"] == direct.json()["choices"][0]["message"]
    comp = {"model": "tiny", "prompt": "The quick", "max_tokens": 3, "temperature": 0}
    r = httpx.post(f"{router}/v1/completions", json=comp, timeout=60)
    assert r.status_code == 200, r.text


def test_flush_cache_through_the_router(router):
    r = httpx.post(f"{router}/flush_cache", timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["workers_flushed"] == 2
