"""Tensor-parallel processes: n-gram and draft-model speculation at tp=2, two "nodes" on loopback, startup
errors from any rank, a worker killed mid-generation (requests fail, the engine and the
server stop: never a hang), rank 0 killed (the workers exit), `radixflow serve --tp-size 2`.

Each test starts its own engine (a process holds one tensor-parallel group at a time).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest
import torch
from kv_checks import assert_kv_released
from server_harness import wait_healthy
from test_speculative_draft import assert_draft_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.cli import main
from radixflow.runtime.config import EngineConfig
from radixflow.runtime.distributed.layout import TPLayout
from radixflow.runtime.speculative.layer_skip import write_layer_skip_draft

COMMON = {"dtype": "float32", "max_total_tokens": 2048, "num_threads": 1}
GREEDY = {"temperature": 0, "max_new_tokens": 16, "ignore_eos": True}
DEATH_BOUND_S = 60.0  # a dead rank is noticed well within this, even on a loaded machine


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return make_tiny_model_dir(tmp_path_factory.mktemp("tp"), "llama", seed=1, vocab_size=384)


@pytest.fixture(scope="module")
def reference(model_dir):
    """tp=1 greedy answers for repeating prompts (so n-gram lookup finds drafts)."""
    g = torch.Generator().manual_seed(0)
    prompts = [torch.randint(2, 300, (n,), generator=g).tolist() * 3 for n in (4, 7, 11)]
    with rf.Engine(str(model_dir), **COMMON) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
    return prompts, [o["output_ids"] for o in outs]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(")")[-1].split()[0] == "Z"  # a zombie has exited
    except FileNotFoundError:
        return True


def _wait_gone(pid: int, bound_s: float) -> None:
    deadline = time.monotonic() + bound_s
    while not _gone(pid):
        assert time.monotonic() < deadline, f"process {pid} still runs after {bound_s}s"
        time.sleep(0.1)


def _spawned_children(pid: int) -> list[int]:
    """The multiprocessing-spawned children of `pid` (its worker ranks)."""
    kids = []
    for task in Path(f"/proc/{pid}/task").iterdir():
        kids += [int(k) for k in (task / "children").read_text().split()]
    return [k for k in kids if b"spawn_main" in Path(f"/proc/{k}/cmdline").read_bytes()]


# -- configuration ------------------------------------------------------------------------
def test_cpu_ranks_of_a_node_split_its_cores_and_memory():
    config = EngineConfig(device="cpu", tp_size=4, nnodes=2, dist_init_addr="h:1")
    layout = TPLayout.of(config)
    ranks = [layout.rank_config(config, r) for r in layout.local_ranks]
    assert all(r.mem_fraction_static == config.mem_fraction_static / 2 for r in ranks)
    assert all(r.num_threads >= 1 and r.device == "cpu" for r in ranks)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"tp_size": 3, "nnodes": 2}, "does not split evenly over nnodes"),
        ({"tp_size": 2, "nnodes": 2}, "needs dist_init_addr"),
        ({"tp_size": 2, "nnodes": 2, "node_rank": 2, "dist_init_addr": "h:1"}, "node_rank"),
        ({"tp_size": 2, "dist_init_addr": "nohost"}, "host:port"),
        ({"tp_size": 0}, "tp_size and nnodes must be >= 1"),
    ],
)
def test_bad_parallel_knobs_are_errors_naming_them(kwargs, message):
    with pytest.raises(ValueError, match=message):
        EngineConfig(**kwargs)


def test_engine_refuses_a_worker_node_rank_and_dp_with_tp(capsys):
    with pytest.raises(ValueError, match="runs only worker ranks"):
        rf.Engine(tp_size=2, nnodes=2, node_rank=1, dist_init_addr="127.0.0.1:1")
    assert main(["serve", "--dp-size", "2", "--tp-size", "2"]) == 2
    assert "--dp-size with --tp-size" in capsys.readouterr().err


# -- engines ------------------------------------------------------------------------------
def test_ngram_speculation_at_tp2_gives_the_plain_tokens(model_dir, reference):
    prompts, expected = reference
    with rf.Engine(str(model_dir), tp_size=2, speculative_algorithm="ngram", **COMMON) as engine:
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == expected
        assert engine.stats["spec_accepted_tokens"] > 0
        assert_kv_released(engine)


def test_draft_model_speculation_at_tp2_gives_the_plain_tokens(model_dir, reference, tmp_path):
    """The draft runs whole on rank 0 (its proposals are the scheduler's business); only the
    target's verifying forward is sharded."""
    prompts, expected = reference
    draft = write_layer_skip_draft(model_dir, tmp_path / "draft", num_layers=1)
    spec = {"speculative_algorithm": "draft", "speculative_draft_model": str(draft)}
    with rf.Engine(str(model_dir), tp_size=2, **spec, **COMMON) as engine:
        assert engine.speculator.proposer.runner.tp.size == 1
        outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
        assert [o["output_ids"] for o in outs] == expected
        stats = engine.stats
        assert 0 < stats["spec_accepted_tokens"] < stats["spec_draft_tokens"]
        assert_kv_released(engine)
        assert_draft_kv_released(engine)


def test_a_shape_that_does_not_shard_is_one_error_from_the_constructor(tmp_path, capsys):
    path = make_tiny_model_dir(
        tmp_path, "llama", seed=1, hidden_size=48, num_attention_heads=3, num_key_value_heads=3
    )
    start = time.monotonic()
    with pytest.raises(ValueError, match=r"tensor-parallel startup failed: rank 0: .*rank 1: "):
        rf.Engine(str(path), tp_size=2, **COMMON)
    assert time.monotonic() - start < DEATH_BOUND_S
    # the server's command line says it as any other bad knob: one line, exit code 2
    knobs = [f"--{k.replace('_', '-')}={v}" for k, v in COMMON.items()]
    assert main(["serve", "--model-path", str(path), "--tp-size", "2", *knobs]) == 2
    assert "radixflow: error: tensor-parallel startup failed" in capsys.readouterr().err
    with rf.Engine(str(path), **COMMON) as engine:  # the group is gone: a new engine starts
        assert engine.generate(input_ids=[5, 6], sampling_params=GREEDY)["output_ids"]


def test_a_killed_worker_fails_the_requests_and_the_engine(model_dir):
    engine = rf.Engine(str(model_dir), tp_size=2, **COMMON)
    try:
        worker = engine.tp_driver.procs[0].pid
        params = {"temperature": 0, "max_new_tokens": 400, "ignore_eos": True}
        stream = engine.generate(input_ids=[5, 6, 7], sampling_params=params, stream=True)
        next(stream)
        waiting: list = []

        def submit_another() -> None:
            try:
                waiting.append(engine.generate(input_ids=[9, 8], sampling_params=params))
            except RuntimeError as exc:  # it reached the engine after the failure: refused
                waiting.append(exc)

        thread = threading.Thread(target=submit_another)
        thread.start()
        os.kill(worker, signal.SIGKILL)
        start = time.monotonic()
        last = list(stream)[-1]
        thread.join(DEATH_BOUND_S)
        assert time.monotonic() - start < DEATH_BOUND_S
        for out in (last, *waiting):
            if isinstance(out, RuntimeError):
                assert "engine failed" in str(out)
                continue
            reason = out["meta_info"]["finish_reason"]
            assert reason["type"] == "abort" and "engine failed" in reason["message"]
            assert out["meta_info"]["completion_tokens"] < 400
        assert len(waiting) == 1
        assert engine.failed.is_set()
        with pytest.raises(RuntimeError, match="engine failed"):
            engine.generate(input_ids=[5], sampling_params=params)
    finally:
        start = time.monotonic()
        engine.shutdown()
        assert time.monotonic() - start < DEATH_BOUND_S


def test_two_nodes_on_loopback(model_dir, reference):
    prompts, expected = reference
    addr = f"127.0.0.1:{_free_port()}"
    parallel = {"tp_size": 2, "nnodes": 2, "dist_init_addr": addr}
    cmd = [sys.executable, "-m", "radixflow", "serve", "--model-path", str(model_dir)]
    cmd += ["--node-rank", "1", "--log-level", "warning"]
    for knob, value in {**COMMON, **parallel}.items():
        cmd += [f"--{knob.replace('_', '-')}", str(value)]
    node1 = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        with rf.Engine(str(model_dir), **parallel, **COMMON) as engine:
            assert engine.tp_driver.procs == []  # node 0 runs rank 0 only; rank 1 is node 1's
            outs = engine.generate(input_ids=prompts, sampling_params=GREEDY)
            assert [o["output_ids"] for o in outs] == expected
        assert node1.wait(timeout=DEATH_BOUND_S) == 0, node1.stdout.read().decode()
    finally:
        if node1.poll() is None:
            node1.kill()
            node1.wait()


def test_killed_rank0_takes_its_workers_down(model_dir):
    script = (
        "import sys, time, radixflow as rf\n"
        f"e = rf.Engine({str(model_dir)!r}, tp_size=2, **{COMMON!r})\n"
        "print(e.tp_driver.procs[0].pid, flush=True)\n"
        "time.sleep(600)\n"
    )
    # not from the checkout: its kernels/ folder would shadow Hugging Face's `kernels`
    proc = subprocess.Popen(
        [sys.executable, "-c", script], stdout=subprocess.PIPE, cwd=model_dir.parent
    )
    try:
        worker = int(proc.stdout.readline())
        proc.kill()
        proc.wait()
        _wait_gone(worker, DEATH_BOUND_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


# -- the server ---------------------------------------------------------------------------
@pytest.mark.slow
def test_serve_tp2_answers_then_fails_and_exits_when_a_worker_dies(model_dir, reference):
    prompts, expected = reference
    port = _free_port()
    cmd = [sys.executable, "-m", "radixflow", "serve", "--model-path", str(model_dir)]
    cmd += ["--port", str(port), "--tp-size", "2", "--log-level", "warning"]
    for knob, value in COMMON.items():
        cmd += [f"--{knob.replace('_', '-')}", str(value)]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(proc, url, 180, lambda: proc.stdout.read().decode())
        r = httpx.post(f"{url}/generate", json={"input_ids": prompts[0], "sampling_params": GREEDY})
        assert r.status_code == 200 and r.json()["output_ids"] == expected[0]
        (worker,) = _spawned_children(proc.pid)
        body = {"input_ids": [5, 6], "sampling_params": {**GREEDY, "max_new_tokens": 400}}
        with httpx.stream("POST", f"{url}/generate", json={**body, "stream": True}) as stream:
            lines = stream.iter_lines()
            next(line for line in lines if line.startswith("data:"))
            os.kill(worker, signal.SIGKILL)
            tail = "\n".join(lines)
        assert "engine failed" in tail
        assert proc.wait(timeout=DEATH_BOUND_S) == 1
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
