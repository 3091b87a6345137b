"""Admission under KV pressure: nothing too big for the pool runs, nothing waits forever, and a
request that does not fit now never blocks the ones behind it (scheduler and engine level)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from concurrent.futures import Future
from typing import Any

import pytest
import torch
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.cache_manager import CacheManager
from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.request import Req
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler import MAX_OVERTAKES, ScheduledStep, Scheduler, SchedulerLimits

POLICIES = ["lpm", "dfs-weight", "fcfs"]
TIMEOUT_S = 120  # a livelock fails the test instead of hanging it


# -- scheduler level: a small pool, requests without a model -----------------------------------
def _scheduler(policy: str = "lpm") -> Scheduler:
    """A 100-token pool (page size 1), prefill chunks of 64 tokens, 16 rows."""
    pool = KVPool(
        num_layers=1,
        num_pages=101,  # page 0 is reserved
        page_size=1,
        num_kv_heads=1,
        head_dim=1,
        dtype=torch.float32,
        device="cpu",
        max_reqs=16,
        max_context=128,
    )
    limits = SchedulerLimits(
        max_running_requests=16, chunked_prefill_size=64, max_prefill_tokens=256, policy=policy
    )
    return Scheduler(CacheManager(pool), limits)


def _req(rid: str, ids: list[int], max_new: int) -> Req:
    return Req(rid, ids, SamplingParams(max_new_tokens=max_new), sampler=None, detokenizer=None)


def _ids(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def _step(sched: Scheduler) -> tuple[ScheduledStep | None, list[Req]]:
    """What Engine.step does around the model: feed the tokens, sample (a fixed token), finish
    at max_new_tokens. Returns the step and the requests that finished (or failed) in it."""
    step = sched.schedule()
    done = list(sched.failed)
    sched.failed.clear()
    for req, n in zip(step.reqs, step.extend_lens, strict=True) if step else ():
        sched.kv.commit(req, n)
        if req.kv.length == req.fill_len:
            req.output_ids.append(7)
            if len(req.output_ids) >= req.params.max_new_tokens:
                sched.remove(req)
                done.append(req)
    return step, done


def _drain(sched: Scheduler, max_steps: int = 1000) -> list[Req]:
    done: list[Req] = []
    for _ in range(max_steps):
        if not sched.has_work():
            return done
        done += _step(sched)[1]
    raise AssertionError(f"still {len(sched.waiting)} waiting after {max_steps} steps")


def _assert_pool_released(sched: Scheduler) -> None:
    assert sched.kv.cache.protected_size() == 0
    sched.flush_cache()
    assert sched.kv.pool.available() == sched.kv.pool.capacity_pages


@pytest.mark.parametrize("policy", POLICIES)
def test_requests_behind_one_that_does_not_fit_are_admitted_in_the_same_step(policy):
    sched = _scheduler(policy=policy)
    running = _req("running", _ids(1000, 40), max_new=30)
    sched.add(running)
    _step(sched)
    big = _req("big", _ids(2000, 60), max_new=5)  # fits alone, not beside `running`
    small = [_req(f"small{i}", _ids(3000 + 100 * i, 10), max_new=3) for i in range(2)]
    for req in [big, *small]:
        sched.add(req)
    step, _ = _step(sched)
    assert step is not None and [r.rid for r in step.reqs] == ["running", "small0", "small1"]
    done = _drain(sched)
    assert {r.rid for r in done} == {"running", "big", "small0", "small1"}
    assert all(r.finish_reason is None for r in done)  # none failed
    assert len(big.output_ids) == 5
    _assert_pool_released(sched)


def test_cached_prefix_is_reused_and_the_rest_evicted_to_fit():
    sched = _scheduler()
    prefix = _ids(1000, 60)
    sched.add(_req("first", prefix, max_new=1))
    sched.add(_req("other", _ids(5000, 30), max_new=1))
    _drain(sched)
    assert sched.kv.cache.evictable_size() == 90 and sched.kv.pool.available() == 10
    # 95 tokens in a 100-token pool: the 60 cached are reused, the other 30 are evicted.
    turn = _req("turn", prefix + _ids(2000, 35), max_new=4)
    sched.add(turn)
    step, _ = _step(sched)
    assert step is not None and step.reqs == [turn] and turn.cached_tokens == 60
    assert [r.rid for r in _drain(sched)] == ["turn"] and turn.finish_reason is None
    _assert_pool_released(sched)


@pytest.mark.parametrize("policy", POLICIES)
def test_overdue_request_stops_others_overtaking_until_it_is_admitted(policy):
    sched = _scheduler(policy=policy)
    sched.add(_req("long", _ids(1000, 20), max_new=30))
    _step(sched)
    big = _req("big", _ids(2000, 85), max_new=5)  # fits only once "long" is done
    sched.add(big)
    overtakes = 0
    for i in range(200):  # a small request arrives every step
        sched.add(_req(f"small{i}", _ids(10_000 + 20 * i, 10), max_new=3))
        step, _ = _step(sched)
        if big.kv.row is not None:  # admitted
            break
        overtakes += sum(1 for r in step.reqs if r.rid.startswith("small") and r.kv.length == 10)
    else:
        raise AssertionError("the big request was never admitted")
    assert overtakes == MAX_OVERTAKES
    _drain(sched)
    assert big.finish_reason is None and len(big.output_ids) == 5
    _assert_pool_released(sched)


@pytest.mark.parametrize(
    ("prompt_len", "max_new", "needs"),
    [(120, 2, 120), (60, 60, 101)],
    ids=["at-admission", "while-growing"],
)
def test_request_larger_than_the_pool_fails_and_frees_everything(prompt_len, max_new, needs):
    # The engine refuses such prompts and stops requests at the pool's capacity; the scheduler
    # alone still never waits on such a request, nor lets it stall others.
    sched = _scheduler()
    huge = _req("huge", _ids(1000, prompt_len), max_new=max_new)
    small = _req("small", _ids(3000, 10), max_new=2)
    sched.add(huge)
    sched.add(small)
    done = _drain(sched)
    assert {r.rid for r in done} == {"huge", "small"} and small.finish_reason is None
    assert huge.finish_reason == {
        "type": "abort",
        "message": f"request needs {needs} KV tokens; the pool holds 100, "
        "0 of them in pinned prefixes",
    }
    _assert_pool_released(sched)


@pytest.mark.parametrize(
    ("prompt_len", "max_new", "needs"),
    [(60, 2, 60), (40, 20, 51)],
    ids=["at-admission", "while-growing"],
)
def test_request_crowded_out_by_pins_fails_but_one_sharing_them_runs(prompt_len, max_new, needs):
    sched = _scheduler()
    system = _ids(1000, 50)
    sched.add(_req("warm", system, max_new=1))
    _drain(sched)
    assert sched.kv.pin("pin", system) == 50
    apart = _req("apart", _ids(5000, prompt_len), max_new=max_new)  # not beside the pin
    sharing = _req("sharing", system + _ids(2000, 40), max_new=5)
    sched.add(apart)
    sched.add(sharing)
    done = _drain(sched)
    assert {r.rid for r in done} == {"apart", "sharing"} and sharing.finish_reason is None
    assert sharing.cached_tokens == 50
    assert apart.finish_reason["type"] == "abort"
    assert f"needs {needs} KV tokens" in apart.finish_reason["message"]
    assert "50 of them in pinned prefixes" in apart.finish_reason["message"]
    sched.kv.unpin("pin")
    _assert_pool_released(sched)


# -- engine level: a tiny random model and a 300-token pool -----------------------------------
POOL = 300


@pytest.fixture(scope="module")
def tiny_path(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("llama"), "llama", seed=3)


@pytest.fixture
def engine(tiny_path):
    engine = rf.Engine(str(tiny_path), dtype="float32", max_total_tokens=POOL)
    yield engine
    engine.shutdown()


def _within(seconds: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """fn's result, raised as TimeoutError when it takes longer (the engine livelocked)."""
    result: Future = Future()

    def run() -> None:
        try:
            result.set_result(fn(*args, **kwargs))
        except Exception as exc:
            result.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return result.result(timeout=seconds)


def _random_ids(n: int, seed: int) -> list[int]:
    return torch.randint(2, 300, (n,), generator=torch.Generator().manual_seed(seed)).tolist()


def _greedy(max_new: int) -> dict[str, Any]:
    return {"max_new_tokens": max_new, "temperature": 0, "ignore_eos": True}


def test_prompt_too_big_for_the_pool_is_refused_and_one_sharing_its_prefix_runs(engine):
    assert engine.context_length == POOL  # the pool, not the model's 512, is the limit
    prompt = _random_ids(350, seed=0)
    with pytest.raises(ValueError, match=r"\(350 tokens\).*KV pool, which holds 300 tokens"):
        _within(5, engine.generate, input_ids=prompt, sampling_params=_greedy(1))
    with pytest.raises(ValueError, match="holds 300 tokens"):
        _within(5, engine.generate, input_ids=prompt[:POOL], sampling_params=_greedy(1))
    out = _within(TIMEOUT_S, engine.generate, input_ids=prompt[:250], sampling_params=_greedy(100))
    # Generation stops where the pool is full: 250 prompt + 50 output tokens.
    assert out["meta_info"]["finish_reason"] == {"type": "length", "length": 50}
    last = _within(TIMEOUT_S, engine.generate, input_ids=prompt[:299], sampling_params=_greedy(5))
    assert last["meta_info"]["completion_tokens"] == 1
    assert last["meta_info"]["cached_tokens"] >= 250
    assert_kv_released(engine)


def test_model_context_length_still_limits_a_larger_pool(tiny_path):
    engine = rf.Engine(str(tiny_path), dtype="float32", max_total_tokens=4096)
    try:
        assert engine.context_length == 512
        with pytest.raises(ValueError, match="model's context length \\(512 tokens\\)"):
            engine.generate(input_ids=_random_ids(600, seed=0), sampling_params=_greedy(1))
    finally:
        engine.shutdown()


def test_small_requests_pass_a_big_one_waiting_for_pages(engine):
    prompts = [_random_ids(100, 1), _random_ids(250, 2)] + [
        _random_ids(20, 3 + i) for i in range(3)
    ]
    params = [_greedy(100), _greedy(10)] + [_greedy(5)] * 3
    outs = _within(TIMEOUT_S, engine.generate, input_ids=prompts, sampling_params=params)
    assert [o["meta_info"]["completion_tokens"] for o in outs] == [100, 10, 5, 5, 5]
    big_ttft = outs[1]["meta_info"]["ttft"]
    assert all(o["meta_info"]["ttft"] < big_ttft for o in outs[2:])
    assert_kv_released(engine)


def test_mixed_load_near_the_pool_size_all_finishes(engine):
    shared = _random_ids(120, seed=10)
    sizes = [280, 150, 40, 200, 260, 230, 30, 290]  # odd ones start with `shared`
    prompts = [
        (shared if i % 2 else []) + _random_ids(n - (120 if i % 2 else 0), seed=20 + i)
        for i, n in enumerate(sizes)
    ]

    async def run_all() -> list[dict[str, Any]]:
        calls = [
            engine.async_generate(input_ids=ids, sampling_params=_greedy(40)) for ids in prompts
        ]
        return await asyncio.wait_for(asyncio.gather(*calls), TIMEOUT_S)

    outs = asyncio.run(run_all())
    for ids, out in zip(prompts, outs, strict=True):
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert out["meta_info"]["completion_tokens"] == min(40, POOL - len(ids))
    assert_kv_released(engine)
