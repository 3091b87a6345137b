"""The Scheduler without a model: a real (small, CPU) KVPool and RadixCache behind a
CacheManager, and a stand-in for the engine's step that commits the fed tokens and appends a
fixed token. Policy order, prefill budget and chunking, page accounting, eviction, retraction
and failure are checked against hand-computed expectations."""

from __future__ import annotations

import pytest
import torch
from test_cache_manager import assert_pages_accounted

from radixflow.runtime.cache_manager import CacheManager
from radixflow.runtime.kv_pool import KVPool
from radixflow.runtime.request import Req
from radixflow.runtime.sampling_params import SamplingParams
from radixflow.runtime.scheduler import ScheduledStep, Scheduler, SchedulerLimits


def make_scheduler(
    *,
    tokens: int = 100,
    page_size: int = 1,
    chunk: int = 64,
    max_prefill: int = 256,
    policy: str = "lpm",
) -> Scheduler:
    """A pool of `tokens` KV tokens (page 0 reserved on top) and 16 request rows."""
    pool = KVPool(
        num_layers=1,
        num_pages=tokens // page_size + 1,
        page_size=page_size,
        num_kv_heads=1,
        head_dim=1,
        dtype=torch.float32,
        device="cpu",
        max_reqs=16,
        max_context=256,
    )
    limits = SchedulerLimits(
        max_running_requests=16,
        chunked_prefill_size=chunk,
        max_prefill_tokens=max_prefill,
        policy=policy,
    )
    return Scheduler(CacheManager(pool), limits)


def make_req(rid: str, ids: list[int], max_new: int = 1) -> Req:
    return Req(rid, ids, SamplingParams(max_new_tokens=max_new), sampler=None, detokenizer=None)


def ids(first: int, n: int) -> list[int]:
    return list(range(first, first + n))


def run_step(sched: Scheduler) -> tuple[ScheduledStep | None, list[Req]]:
    """Schedule, commit the fed tokens, sample token 7 where a row completes; returns the step
    and the requests that finished or failed in it."""
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
    assert_pages_accounted(sched.kv, sched.running)
    return step, done


def drain(sched: Scheduler, max_steps: int = 500) -> list[Req]:
    done: list[Req] = []
    for _ in range(max_steps):
        if not sched.has_work():
            return done
        done += run_step(sched)[1]
    raise AssertionError(f"{len(sched.waiting)} waiting after {max_steps} steps")


def assert_all_free(sched: Scheduler) -> None:
    assert sched.kv.cache.protected_size() == 0
    sched.flush_cache()
    assert sched.kv.pool.available() == sched.kv.pool.capacity_pages


A, B = ids(1000, 40), ids(2000, 40)  # two cached prompts
# Queue order, with each one's cached prefix: 0, 20 of A, all of B, 30 of B, all of A, 30 of B.
WAITING = {
    "none": ids(5000, 10),
    "a_short": A[:20] + ids(6000, 5),
    "b_full": B + ids(7000, 5),
    "b_part": B[:30] + ids(8000, 5),
    "a_full": A + ids(9000, 5),
    "b_part2": B[:30] + ids(8500, 5),
}
EXPECTED_ORDER = {
    "fcfs": list(WAITING),
    "lpm": ["b_full", "a_full", "b_part", "b_part2", "a_short", "none"],  # stable on ties
    # Root first, then the heavier subtree (B: 3 below its first 30 tokens, A: 2), depth first.
    "dfs-weight": ["none", "b_part", "b_part2", "b_full", "a_short", "a_full"],
}


@pytest.mark.parametrize("policy", list(EXPECTED_ORDER))
def test_admission_follows_the_policy_order(policy):
    sched = make_scheduler(tokens=300, policy=policy)
    for prompt in (A, B):
        sched.add(make_req("warm", prompt))
    drain(sched)
    for rid, prompt in WAITING.items():
        sched.add(make_req(rid, prompt))
    step, _ = run_step(sched)
    assert step is not None and [r.rid for r in step.reqs] == EXPECTED_ORDER[policy]
    cached = {r.rid: r.cached_tokens for r in step.reqs}
    assert cached == dict(none=0, a_short=20, b_full=40, b_part=30, a_full=40, b_part2=30)
    drain(sched)
    assert_all_free(sched)


def test_chunked_prefill_spends_the_budget_and_decodes_are_free():
    sched = make_scheduler(tokens=300, chunk=64)
    long = make_req("long", ids(1000, 150), max_new=3)
    sched.add(long)
    step, _ = run_step(sched)
    assert step.extend_lens == [64]
    sched.add(make_req("short", ids(2000, 30), max_new=3))
    step, _ = run_step(sched)
    assert [r.rid for r in step.reqs] == ["long"] and step.extend_lens == [64]  # budget spent
    step, _ = run_step(sched)
    assert [r.rid for r in step.reqs] == ["long", "short"] and step.extend_lens == [22, 30]
    sched.add(make_req("whole", ids(3000, 64), max_new=1))
    step, _ = run_step(sched)  # two decodes take no prefill budget: the 64 tokens fit
    assert [r.rid for r in step.reqs] == ["long", "short", "whole"]
    assert step.extend_lens == [1, 1, 64]
    assert len(step.out_cache_loc) == 66
    drain(sched)
    assert_all_free(sched)


def test_without_chunking_prompts_go_whole_and_only_the_first_may_pass_the_budget():
    sched = make_scheduler(tokens=300, chunk=-1, max_prefill=100)
    for rid, first, n in (("big", 1000, 150), ("a", 2000, 80), ("b", 3000, 80)):
        sched.add(make_req(rid, ids(first, n), max_new=2))
    step, _ = run_step(sched)
    assert [r.rid for r in step.reqs] == ["big"] and step.extend_lens == [150]
    step, _ = run_step(sched)  # 80 fits the budget; the second 80 waits for the next step
    assert [r.rid for r in step.reqs] == ["big", "a"] and step.extend_lens == [1, 80]
    step, _ = run_step(sched)
    assert [r.rid for r in step.reqs] == ["a", "b"] and step.extend_lens == [1, 80]
    drain(sched)
    assert_all_free(sched)


@pytest.mark.parametrize("page_size", [1, 4])
def test_every_page_comes_back_after_the_requests_finish(page_size):
    sched = make_scheduler(tokens=96, page_size=page_size, chunk=16)
    free_before = sched.kv.pool.available()
    gen = torch.Generator().manual_seed(0)
    shared = ids(100, 20)
    for i in range(12):
        n, max_new = (int(x) for x in torch.randint(1, 30, (2,), generator=gen))
        prompt = (shared[:n] if i % 2 else ids(1000 * i, n)) + ids(50_000 + 100 * i, 3)
        sched.add(make_req(f"r{i}", prompt, max_new=max_new))
    done = drain(sched)
    assert len(done) == 12 and all(r.finish_reason is None for r in done)
    assert all(len(r.output_ids) == r.params.max_new_tokens for r in done)
    tree_pages = sched.kv.cache.total_size() // page_size
    assert sched.kv.pool.available() + tree_pages == free_before
    assert_all_free(sched)
    assert sched.kv.pool.available() == free_before


def test_admission_evicts_the_least_recently_used_prefix():
    sched = make_scheduler(tokens=100)
    for prompt in (A, B):  # one at a time, so each is one whole leaf
        sched.add(make_req("warm", prompt))
        drain(sched)
    sched.add(make_req("touch", A + ids(3000, 2)))  # A is used again: B is now the older
    drain(sched)
    assert sched.kv.cache.evictable_size() == 82 and sched.kv.pool.available() == 18
    new = make_req("new", ids(5000, 30), max_new=2)
    sched.add(new)
    step, _ = run_step(sched)
    assert step.reqs == [new]
    assert sched.kv.match(B).slots.numel() == 0  # evicted whole: its leaf held 40
    assert sched.kv.match(A + ids(3000, 2)).slots.numel() == 42
    assert sched.kv.pool.available() == 28
    drain(sched)
    assert_all_free(sched)


def test_decode_that_cannot_grow_retracts_the_newest_request():
    sched = make_scheduler(tokens=40)
    first = make_req("first", ids(1000, 15), max_new=20)
    second = make_req("second", ids(2000, 15), max_new=20)
    sched.add(first)
    sched.add(second)
    step, _ = run_step(sched)
    assert step.reqs == [first, second]
    for _ in range(20):
        step, _ = run_step(sched)
        if sched.num_retractions:
            break
    assert sched.num_retractions == 1 and second.retractions == 1
    assert step.reqs == [first] and sched.waiting == [second] and second.kv.row is None
    kept = list(second.output_ids)
    assert 0 < len(kept) < 20
    done = drain(sched)
    assert done == [first, second] and all(r.finish_reason is None for r in done)
    assert len(first.output_ids) == len(second.output_ids) == 20
    assert second.output_ids[: len(kept)] == kept
    assert second.cached_tokens == 0  # what its first admission found
    assert_all_free(sched)


@pytest.mark.parametrize("page_size", [1, 4])
def test_a_prompt_longer_than_the_pool_fails_alone(page_size):
    sched = make_scheduler(tokens=100, page_size=page_size)
    before = make_req("before", ids(1000, 10), max_new=2)
    huge = make_req("huge", ids(2000, 120), max_new=2)
    after = make_req("after", ids(3000, 10), max_new=2)
    for req in (before, huge, after):
        sched.add(req)
    done = drain(sched)
    assert {r.rid for r in done} == {"before", "huge", "after"}
    assert huge.finish_reason == {
        "type": "abort",
        "message": "request needs 120 KV tokens; the pool holds 100, 0 of them in pinned prefixes",
    }
    assert before.finish_reason is None and after.finish_reason is None
    assert len(before.output_ids) == len(after.output_ids) == 2
    assert_all_free(sched)


def test_drafts_are_dropped_when_free_pages_do_not_cover_them():
    # Speculation never evicts the cache (nor retracts): evictable pages do not count.
    sched = make_scheduler(tokens=30)
    sched.add(make_req("warm", ids(5000, 14)))
    drain(sched)
    req = make_req("req", ids(1000, 10), max_new=10)
    sched.add(req)
    run_step(sched)
    assert sched.kv.pool.available() == 6 and sched.kv.cache.evictable_size() == 14
    req.draft_ids = [1, 2, 3, 4, 5, 6]  # 7 tokens to feed: 7 pages, 6 free
    step = sched.schedule()
    assert step.extend_lens == [1] and req.draft_ids == []
    assert sched.kv.cache.evictable_size() == 14
    sched.kv.commit(req, 1)
    req.output_ids.append(7)
    req.draft_ids = [1, 2, 3, 4]  # 5 tokens, 5 free pages
    step = sched.schedule()
    assert step.extend_lens == [5] and req.draft_ids == [1, 2, 3, 4]
    assert sched.kv.pool.available() == 0 and sched.num_retractions == 0
