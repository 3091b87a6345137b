"""`radixflow serve --dp-size N`: replicas behind SGLang's real router (sglang_router), tiny
models on loopback. Requests sharing a long prefix land on the replica that cached it, distinct
prefixes spread over both, admin and health routes pass through; the supervisor stops every
child on SIGTERM and when one child dies; without the router extra the error names it."""

from __future__ import annotations

import importlib.util
import os
import random
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
import test_router
from prometheus_client.parser import text_string_to_metric_families
from test_router import START_TIMEOUT, _free_port, _stop
from transformers import AutoTokenizer

from radixflow.runtime import cli
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.server.data_parallel import ReplicaPlan, replica_gpus

needs_router = pytest.mark.skipif(
    importlib.util.find_spec("sglang_router") is None,
    reason="sglang-router is not installed (pip install 'radixflow[router]')",
)
WORDS = "alpha beta gamma delta river stone cloud paper seven orange quiet window".split()
GREEDY = {"temperature": 0, "ignore_eos": True}
tiny_model = test_router.model_dir  # its tiny model folder, a fixture here too


@dataclass
class DPServer:
    proc: subprocess.Popen
    url: str
    workers: list[str]
    log: Path


def _launch(model: Path, log: Path, api_key: str | None = None) -> DPServer:
    """`radixflow serve --dp-size 2` in a subprocess (outside the checkout), ready to serve."""
    port = _free_port()
    cmd = [sys.executable, "-m", "radixflow", "serve", "--model-path", str(model)]
    cmd += ["--port", str(port), "--dp-size", "2", "--dtype", "float32"]
    cmd += ["--max-total-tokens", "2048", "--graceful-timeout", "1", "--log-level", "warning"]
    cmd += ["--api-key", api_key] if api_key else []
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(
        cmd, cwd=log.parent, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 2 * START_TIMEOUT
    while True:  # the router answers once both replicas are registered
        assert proc.poll() is None, log.read_text()[-3000:]
        assert time.monotonic() < deadline, log.read_text()[-3000:]
        try:
            loads = httpx.get(f"{url}/get_loads", headers=_auth(api_key), timeout=2).json()[
                "workers"
            ]
            if len(loads) == 2:
                return DPServer(proc, url, sorted(w["worker"] for w in loads), log)
        except httpx.TransportError:
            pass
        time.sleep(0.3)


def _children(pid: int) -> list[int]:
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        if ppid == pid:
            found.append(int(stat.parent.name))
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _requests_served(worker: str) -> float:
    text = httpx.get(f"{worker}/metrics", timeout=10).text
    return sum(
        s.value
        for family in text_string_to_metric_families(text)
        if family.name == "radixflow_requests"
        for s in family.samples
        if s.name == "radixflow_requests_total"
    )


def _words(seed: int, n: int = 64) -> str:
    """About 320 tokens of the tiny tokenizer (these words are not in its merges)."""
    rng = random.Random(seed)
    return " ".join(rng.choice(WORDS) for _ in range(n))


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _generate(url: str, text: str, max_new_tokens: int = 2, api_key: str | None = None) -> dict:
    body = {"text": text, "sampling_params": {**GREEDY, "max_new_tokens": max_new_tokens}}
    r = httpx.post(f"{url}/generate", json=body, headers=_auth(api_key), timeout=60)
    assert r.status_code == 200, r.text
    return r.json()["meta_info"]


@pytest.fixture(scope="module")
def dp_server(tiny_model, tmp_path_factory) -> Iterator[DPServer]:
    server = _launch(tiny_model, tmp_path_factory.mktemp("dp") / "serve.log")
    try:
        yield server
    finally:
        _stop(server.proc)


@pytest.fixture(scope="module")
def tokenizer(tiny_model):
    return AutoTokenizer.from_pretrained(tiny_model)


@needs_router
@pytest.mark.slow
def test_shared_long_prefix_lands_on_the_replica_that_cached_it(dp_server, tokenizer):
    prefix = _words(seed=1)
    prefix_tokens = len(tokenizer(prefix).input_ids)
    assert prefix_tokens >= 256
    before = [_requests_served(w) for w in dp_server.workers]
    _generate(dp_server.url, f"{prefix} question 0")
    # Sent together, requests that match nothing spread (the next test); these all follow
    # the cached prefix.
    with ThreadPoolExecutor(4) as pool:
        texts = [f"{prefix} question {i}" for i in range(1, 5)]
        metas = list(pool.map(lambda text: _generate(dp_server.url, text, 24), texts))
    served = [_requests_served(w) - b for w, b in zip(dp_server.workers, before, strict=True)]
    assert sorted(served) == [0, 5]
    for meta in metas:
        assert prefix_tokens <= meta["cached_tokens"] < meta["prompt_tokens"]


@needs_router
@pytest.mark.slow
def test_distinct_prefixes_spread_over_both_replicas(dp_server):
    """Prompts matching nothing cached go to the replica with the fewest requests in flight:
    sent together, they spread (sent one by one, each would find both idle)."""
    before = [_requests_served(w) for w in dp_server.workers]
    with ThreadPoolExecutor(6) as pool:
        metas = list(
            pool.map(lambda seed: _generate(dp_server.url, _words(seed), 24), range(100, 106))
        )
    assert all(meta["cached_tokens"] < 64 for meta in metas)
    served = [_requests_served(w) - b for w, b in zip(dp_server.workers, before, strict=True)]
    assert sum(served) == 6 and min(served) >= 1, served


@needs_router
@pytest.mark.slow
def test_flush_cache_and_health_pass_through_the_router(dp_server):
    text = _words(seed=7)
    _generate(dp_server.url, text)
    assert _generate(dp_server.url, text)["cached_tokens"] > 256
    r = httpx.post(f"{dp_server.url}/flush_cache", timeout=30)
    assert r.status_code == 200 and r.json()["workers_flushed"] == 2, r.text
    assert _generate(dp_server.url, text)["cached_tokens"] == 0
    for path in ("/health", "/health_generate", "/get_model_info", "/v1/models"):
        assert httpx.get(f"{dp_server.url}{path}", timeout=30).status_code == 200, path


@needs_router
@pytest.mark.slow
def test_every_route_the_router_calls_answers_on_a_replica(dp_server):
    worker = dp_server.workers[0]
    for path in ("/health", "/health_generate"):
        assert httpx.get(f"{worker}{path}", timeout=30).status_code == 200, path
    info = [
        httpx.get(f"{worker}{p}", timeout=10).json() for p in ("/model_info", "/get_model_info")
    ]
    assert info[0] == info[1] and info[0]["is_generation"] is True
    server = [
        httpx.get(f"{worker}{p}", timeout=10).json() for p in ("/server_info", "/get_server_info")
    ]
    assert server[0]["version"] == server[1]["version"] and server[0]["context_length"] == 512
    (load,) = httpx.get(f"{worker}/get_load", timeout=10).json()
    assert {"dp_rank", "num_reqs", "num_waiting_reqs", "num_tokens"} <= load.keys()
    r = httpx.get(f"{worker}/metrics", timeout=10)
    assert r.status_code == 200 and "radixflow_num_running_reqs" in r.text
    models = httpx.get(f"{worker}/v1/models", timeout=10).json()["data"]
    assert models[0]["id"] == info[0]["served_model_name"]


@needs_router
@pytest.mark.slow
def test_sigterm_stops_the_router_and_every_replica(tiny_model, tmp_path):
    server = _launch(tiny_model, tmp_path / "serve.log")
    children = _children(server.proc.pid)
    try:
        assert len(children) == 3  # two replicas and the router
        assert _generate(server.url, "The quick brown fox")["completion_tokens"] == 2
        server.proc.send_signal(signal.SIGTERM)
        assert server.proc.wait(timeout=60) == 0, server.log.read_text()[-3000:]
    finally:
        _stop(server.proc)
    assert not [pid for pid in children if _alive(pid)]


@needs_router
@pytest.mark.slow
def test_the_key_guards_the_router_and_a_dead_replica_stops_the_rest(tiny_model, tmp_path):
    server = _launch(tiny_model, tmp_path / "serve.log", api_key="sekrit")
    children = _children(server.proc.pid)
    try:  # the router checks the key and sends it on to the replicas
        body = {"text": "The quick brown fox", "sampling_params": GREEDY}
        assert httpx.post(f"{server.url}/generate", json=body, timeout=60).status_code == 401
        assert (
            _generate(server.url, "The quick brown fox", api_key="sekrit")["completion_tokens"] == 2
        )
        port = server.workers[1].rsplit(":", 1)[1]
        victim = next(p for p in children if f"--port {port} " in _cmdline(p))
        os.kill(victim, signal.SIGKILL)
        assert server.proc.wait(timeout=60) == 1
    finally:
        _stop(server.proc)
    log = server.log.read_text()
    assert f"(pid {victim}, {server.workers[1]}) exited with code -9; stopping the others" in log
    assert not [pid for pid in children if _alive(pid)]


def _cmdline(pid: int) -> str:
    return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()


# -- fast checks of the launcher, no process started -------------------------------------------


def test_without_the_router_extra_the_error_names_it(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "sglang_router", None)  # as if not installed
    start = time.monotonic()
    assert cli.main(["serve", "--dp-size", "2", "--model-path", "nowhere"]) == 2
    assert time.monotonic() - start < 5
    err = capsys.readouterr().err
    assert "sglang_router is not installed: pip install 'radixflow[router]'" in err


@needs_router
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--dp-size", "0"], "--dp-size must be >= 1, got 0"),
        (["--dp-size", "2", "--admin-api-key", "a"], "--admin-api-key with --dp-size"),
        (["--dp-size", "2", "--page-size", "0"], "page_size"),
    ],
)
def test_bad_dp_options_fail_before_any_process_starts(argv, message, capsys):
    assert cli.main(["serve", "--model-path", "nowhere", "--device", "cpu", *argv]) == 2
    assert message in capsys.readouterr().err


def test_replica_command_overrides_address_and_splits_cores_and_memory():
    argv = ["serve", "--model-path", "m", "--port=9000", "--dp-size", "2", "--api-key", "k"]
    plan = ReplicaPlan(2, "0.0.0.0", 9000, argv, None, "cpu", 0.8, api_key="k")
    cmd = plan.worker_command(4321, shares_memory=True)
    assert cmd[:3] == [sys.executable, "-m", "radixflow"]
    args = cli.build_parser().parse_args(cmd[3:])
    assert (args.host, args.port, args.dp_size, args.api_key) == ("127.0.0.1", 4321, 1, "k")
    assert args.num_threads == max(1, len(os.sched_getaffinity(0)) // 2)
    assert args.mem_fraction_static == 0.4
    given = ReplicaPlan(2, "0.0.0.0", 9000, [*argv, "--num-threads", "3"], 3, "cuda", 0.8)
    args = cli.build_parser().parse_args(given.worker_command(1, shares_memory=False)[3:])
    assert (args.num_threads, args.mem_fraction_static) == (3, EngineConfig().mem_fraction_static)


@needs_router
def test_router_command_is_what_the_installed_router_parses():
    from sglang_router.launch_router import parse_router_args

    plan = ReplicaPlan(2, "0.0.0.0", 8000, [], None, "cpu", 0.8, api_key="k", graceful_timeout=5)
    cmd = plan.router_command(["http://127.0.0.1:1", "http://127.0.0.1:2"], 8001)
    assert cmd[1:3] == ["-m", "sglang_router.launch_router"]
    args = parse_router_args(cmd[3:])
    assert (args.host, args.port, args.policy) == ("0.0.0.0", 8000, "cache_aware")
    assert args.worker_urls == ["http://127.0.0.1:1", "http://127.0.0.1:2"]
    assert (args.api_key, args.prometheus_port, args.shutdown_grace_period_secs) == ("k", 8001, 5)


def test_replicas_take_one_gpu_each(monkeypatch):
    import torch

    from radixflow.runtime import model_runner

    assert replica_gpus("cpu", 2) is None
    monkeypatch.setattr(model_runner, "resolve_device", lambda name: torch.device("cuda"))
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3,5,6")
    assert replica_gpus("auto", 2) == ["3", "5"]
    with pytest.raises(ValueError, match="--dp-size 4 needs one GPU per replica and 3"):
        replica_gpus("cuda", 4)
    with pytest.raises(ValueError, match="give --device cuda"):
        replica_gpus("cuda:1", 2)
