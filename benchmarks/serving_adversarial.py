"""The soak test's adversarial clients: pathological grammars, oversized prompts, bad bodies."""

from __future__ import annotations

import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import SERVING_WORDS  # noqa: E402

HUGE_INT_SCHEMA = {"type": "integer", "minimum": 0, "maximum": 9007199254740991}
AMBIGUOUS_LARK = 'start: x\nx: "a" | "b" | x x | x x x | x x x x'


@dataclass
class ServerShape:
    """What the adversarial requests are sized from (read once from /server_info)."""

    context_length: int
    pool_tokens: int
    vocab_size: int
    big_text: str  # an 8 MB prompt


def server_shape(url: str) -> ServerShape:
    info = httpx.get(url + "/server_info", timeout=30).json()
    words = " ".join(SERVING_WORDS) + " "
    big = (words * (8 * 2**20 // len(words) + 1))[: 8 * 2**20]
    return ServerShape(
        context_length=info["context_length"],
        pool_tokens=info["kv_pages_total"] * info.get("page_size", 1),
        vocab_size=info["vocab_size"],
        big_text=big,
    )


def _finish_type(out: object) -> str:
    """The finish reason of a native or OpenAI answer (the first one of a batch)."""
    if isinstance(out, list):
        out = out[0] if out else {}
    if not isinstance(out, dict):
        return "?"
    if "meta_info" in out:
        reason = out["meta_info"].get("finish_reason") or {}
        return reason.get("type", "?") if isinstance(reason, dict) else str(reason)
    choices = out.get("choices") or [{}]
    return str(choices[0].get("finish_reason"))


def _answer(r: httpx.Response) -> tuple[int, str]:
    finish = ""
    if r.status_code == 200:
        try:
            finish = _finish_type(r.json())
        except ValueError:
            finish = "non-JSON"
    return r.status_code, finish


def _gen(params: dict, text: str = "Answer:") -> dict:
    return {"text": text, "sampling_params": {"max_new_tokens": 16, **params}}


async def adv_json_schema_huge_int(c: httpx.AsyncClient, shape: ServerShape, rng):
    return _answer(
        await c.post("/generate", json=_gen({"json_schema": json.dumps(HUGE_INT_SCHEMA)}))
    )


async def adv_regex_nested(c: httpx.AsyncClient, shape: ServerShape, rng):
    return _answer(await c.post("/generate", json=_gen({"regex": "((a{0,40}){0,40}){0,40}"})))


async def adv_regex_huge_repeat(c: httpx.AsyncClient, shape: ServerShape, rng):
    return _answer(await c.post("/generate", json=_gen({"regex": "a{1000000}"})))


async def adv_lark_ambiguous(c: httpx.AsyncClient, shape: ServerShape, rng):
    return _answer(await c.post("/generate", json=_gen({"lark": AMBIGUOUS_LARK})))


def _random_ids(rng: random.Random, n: int, vocab: int) -> list[int]:
    return [rng.randrange(2, vocab) for _ in range(n)]


async def adv_prompt_over_context(c: httpx.AsyncClient, shape: ServerShape, rng):
    ids = _random_ids(rng, shape.context_length + 1, shape.vocab_size)
    body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4}}
    return _answer(await c.post("/generate", json=body))


async def adv_prompt_over_kv_pool(c: httpx.AsyncClient, shape: ServerShape, rng):
    """More tokens than the whole KV pool holds (within the context when the pool is the
    smaller): must be refused, not left waiting for pages that never come."""
    body = {
        "input_ids": _random_ids(rng, shape.pool_tokens + 1, shape.vocab_size),
        "sampling_params": {"max_new_tokens": 4},
    }
    return _answer(await c.post("/generate", json=body))


async def adv_prompt_8mb(c: httpx.AsyncClient, shape: ServerShape, rng):
    body = {"model": "m", "prompt": shape.big_text, "max_tokens": 4}
    return _answer(await c.post("/v1/completions", json=body))


async def adv_n_over_cap(c: httpx.AsyncClient, shape: ServerShape, rng):
    body = {"text": ["Hello there"] * 33, "sampling_params": {"max_new_tokens": 2, "n": 16}}
    return _answer(await c.post("/generate", json=body))


BAD_BODIES = [
    b'{"text": "hi", "sampling_params": {',
    b'{"text": "hi", "sampling_params": {"max_new_tokens": NaN}}',
    b'{"model": "m", "prompt": "hi", "max_tokens": Infinity}',
    b"\xff\xfe not json",
]


async def adv_bad_json(c: httpx.AsyncClient, shape: ServerShape, rng):
    path = rng.choice(["/generate", "/v1/completions", "/v1/chat/completions"])
    body = rng.choice(BAD_BODIES)
    r = await c.post(path, content=body, headers={"content-type": "application/json"})
    return _answer(r)


async def adv_disconnect_mid_stream(c: httpx.AsyncClient, shape: ServerShape, rng):
    body = _gen({"max_new_tokens": 256, "ignore_eos": True}) | {"stream": True}
    async with c.stream("POST", "/generate", json=body) as r:
        async for line in r.aiter_lines():
            if line.startswith("data: "):
                return r.status_code, "disconnected"
        return r.status_code, "ended before any event"


async def adv_disconnect_before_answer(c: httpx.AsyncClient, shape: ServerShape, rng):
    body = {"model": "m", "prompt": "Tell me", "max_tokens": 256, "ignore_eos": True}
    try:
        await asyncio.wait_for(c.post("/v1/completions", json=body), timeout=rng.uniform(0.01, 0.3))
    except TimeoutError:
        return 0, "disconnected"
    return 200, "answered first"


ADVERSARIAL = {
    "json_schema huge int range": adv_json_schema_huge_int,
    "regex ((a{0,40}){0,40}){0,40}": adv_regex_nested,
    "regex a{1000000}": adv_regex_huge_repeat,
    "lark ambiguous x: x x | x x x": adv_lark_ambiguous,
    "prompt over context": adv_prompt_over_context,
    "prompt over KV pool": adv_prompt_over_kv_pool,
    "8 MB prompt": adv_prompt_8mb,
    "prompts x n over cap": adv_n_over_cap,
    "bad JSON body": adv_bad_json,
    "disconnect mid-stream": adv_disconnect_mid_stream,
    "disconnect before answer": adv_disconnect_before_answer,
}


def _adv_entry() -> dict:
    return {"requests": 0, "status": {}, "finish": {}, "timeouts": 0, "transport": [], "max_s": 0.0}


async def adversarial_client(
    client: httpx.AsyncClient,
    index: int,
    rng: random.Random,
    deadline: float,
    stats: dict,
    shape: ServerShape,
    bound: float,
) -> None:
    """Cycles through the adversarial kinds (each client starting at its own); every request
    is bounded by `bound` seconds."""
    kinds = list(ADVERSARIAL.items())
    k = index
    while time.monotonic() < deadline:
        name, send = kinds[k % len(kinds)]
        k += 1
        entry = stats["adversarial"].setdefault(name, _adv_entry())
        entry["requests"] += 1
        start = time.perf_counter()
        try:
            status, finish = await asyncio.wait_for(send(client, shape, rng), timeout=bound)
        except TimeoutError:
            entry["timeouts"] += 1
            continue
        except httpx.HTTPError as exc:
            entry["transport"].append(repr(exc))
            continue
        finally:
            entry["max_s"] = max(entry["max_s"], time.perf_counter() - start)
        entry["status"][status] = entry["status"].get(status, 0) + 1
        if finish:
            entry["finish"][finish] = entry["finish"].get(finish, 0) + 1
