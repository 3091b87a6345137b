"""Online serving benchmark and soak test against a running HTTP server (loopback only).

Load mode: Poisson arrivals at several request rates, seeded random prompt/output lengths,
streaming /v1/completions; prints throughput, TTFT and inter-token latency p50/p99 per rate.
With --compare-transformers the same load runs against `transformers serve` on the same model.

    python benchmarks/serving.py --rates 1,2,4 --num-prompts 24
    python benchmarks/serving.py --soak --soak-seconds 120 --clients 200
    python benchmarks/serving.py --soak --adversarial-share 0.2
    python benchmarks/serving.py --soak --compare-adversarial --adversarial-share 0.2

Soak mode: `--clients` concurrent streaming clients (mixed /generate and /v1/chat/completions),
a share of which disconnect mid-stream, for a bounded time. It asserts zero 5xx responses,
every KV page free afterwards (after /flush_cache) and resident memory flat, and reports the
normal clients' end-to-end latency and TTFT (p50/p99).

With --adversarial-share S, that share of the clients is adversarial: each cycles through
pathological grammars (a huge integer range, nested and huge regex repeats, an ambiguous Lark
grammar), prompts over the context and the KV pool, an 8 MB prompt, prompts x n over the
per-call cap, malformed JSON, and disconnects before and during a stream. Those must get a 4xx
or an abort finish reason (counted per kind), never a 5xx, and answer within
--adversarial-timeout seconds (a timeout is a failure). --compare-adversarial runs the soak
twice on the same server, without and then with the adversarial clients (same seed, same
normal clients), and compares the normal clients' latency (target: p99 within 2x).

Without --url the script starts `python -m radixflow serve` itself (and stops it).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from common import print_table  # noqa: E402

WORDS = (
    "the of and to in is was for on are with as by at from this that have be it not or his "
    "her they we you all were when which their said there would about time into has more "
    "river mountain city garden engine story music letter window market winter summer light"
).split()


# -- servers ----------------------------------------------------------------------------------
@dataclass
class Launched:
    name: str
    url: str
    proc: subprocess.Popen

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _wait_ready(url: str, health: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}")
        try:
            if httpx.get(url + health, timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{url} not ready after {timeout:.0f}s")


def launch_radixflow(port: int, extra: list[str]) -> Launched:
    cmd = [sys.executable, "-m", "radixflow", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--log-level", "warning", *extra]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    _wait_ready(url, "/health", proc, 300)
    return Launched("radixflow", url, proc)


def launch_transformers(port: int, model_dir: str, dtype: str) -> Launched | str:
    """`transformers serve` on the same checkpoint, offline; a reason string if it cannot run."""
    exe = Path(sys.executable).with_name("transformers")
    if not exe.exists():
        return "the `transformers` command is not installed"
    cmd = [str(exe), "serve", model_dir, "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--device", "cpu", "--dtype", dtype, "--log-level", "error"]
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    try:
        _wait_ready(url, "/health", proc, 300)
    except RuntimeError as exc:
        proc.kill()
        err = (
            proc.stderr.read().decode(errors="replace").strip().splitlines()[-3:]
            if proc.stderr
            else []
        )
        return f"transformers serve did not start ({exc}): {' '.join(err)}"
    return Launched("transformers serve", url, proc)


# -- load mode --------------------------------------------------------------------------------
@dataclass
class Sample:
    prompt: str
    max_tokens: int


@dataclass
class Outcome:
    ok: bool = False
    status: int = 0
    ttft: float | None = None
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    latency: float = 0.0


def make_samples(n: int, input_len: int, output_len: int, seed: int) -> list[Sample]:
    """Prompts of roughly input_len/2..3*input_len/2 words; outputs likewise around output_len."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        words = rng.randint(max(1, input_len // 2), input_len * 3 // 2)
        prompt = " ".join(rng.choice(WORDS) for _ in range(words))
        out.append(Sample(prompt, rng.randint(max(1, output_len // 2), output_len * 3 // 2)))
    return out


async def one_completion(
    client: httpx.AsyncClient, model: str, sample: Sample, extra: dict
) -> Outcome:
    body = {
        "model": model,
        "prompt": sample.prompt,
        "max_tokens": sample.max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
        **extra,
    }
    out = Outcome()
    start = last = time.perf_counter()
    async with client.stream("POST", "/v1/completions", json=body) as r:
        out.status = r.status_code
        if r.status_code != 200:
            await r.aread()
            return out
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            data = json.loads(line[6:])
            if data.get("usage"):
                out.tokens = data["usage"]["completion_tokens"]
            if data.get("choices") and data["choices"][0].get("text"):
                now = time.perf_counter()
                if out.ttft is None:
                    out.ttft = now - start
                else:
                    out.itls.append(now - last)
                last = now
                if not data.get("usage"):
                    out.tokens = max(out.tokens, len(out.itls) + 1)
    out.latency = time.perf_counter() - start
    out.ok = True
    return out


async def run_rate(
    url: str, model: str, samples: list[Sample], rate: float, seed: int, extra: dict
):
    rng = random.Random(seed)
    limits = httpx.Limits(max_connections=len(samples) + 8)
    async with httpx.AsyncClient(base_url=url, timeout=600, limits=limits) as client:
        tasks = []
        start = time.perf_counter()
        for s in samples:
            tasks.append(asyncio.ensure_future(one_completion(client, model, s, extra)))
            await asyncio.sleep(rng.expovariate(rate))
        outcomes = await asyncio.gather(*tasks)
        wall = time.perf_counter() - start
    return outcomes, wall


def _pct(values: list[float], q: float) -> float:
    if not values:
        return float("nan")
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=100, method="inclusive")[int(q) - 1]


def summarize(name: str, rate: float, outcomes: list[Outcome], wall: float) -> list[object]:
    ok = [o for o in outcomes if o.ok]
    ttfts = [o.ttft for o in ok if o.ttft is not None]
    itls = [x for o in ok for x in o.itls]
    tokens = sum(o.tokens for o in ok)
    return [
        name,
        f"{rate:g}",
        f"{len(ok)}/{len(outcomes)}",
        f"{len(ok) / wall:.2f}",
        f"{tokens / wall:.1f}",
        f"{1000 * _pct(ttfts, 50):.0f}",
        f"{1000 * _pct(ttfts, 99):.0f}",
        f"{1000 * _pct(itls, 50):.0f}",
        f"{1000 * _pct(itls, 99):.0f}",
    ]


HEADERS = ["server", "req/s in", "ok", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
           "ITL p50 ms", "ITL p99 ms"]  # fmt: skip


def load(args: argparse.Namespace, servers: list[tuple[str, str, str, dict]]) -> None:
    rows = []
    for k, rate in enumerate(args.rates):
        # fresh prompts per rate (same distribution), so no rate reuses another's cached prefixes
        samples = make_samples(args.num_prompts, args.input_len, args.output_len, args.seed + k)
        for name, url, model, extra in servers:
            outcomes, wall = asyncio.run(run_rate(url, model, samples, rate, args.seed, extra))
            rows.append(summarize(name, rate, outcomes, wall))
            print(" ".join(str(c) for c in rows[-1]), flush=True)
    print()
    print(
        f"{args.num_prompts} requests per rate; prompts ~{args.input_len} words, outputs "
        f"~{args.output_len} tokens (seed {args.seed} + rate index); streaming /v1/completions"
    )
    print_table(HEADERS, rows)


# -- soak mode --------------------------------------------------------------------------------
def metric(url: str, name: str) -> float:
    return _sample(httpx.get(url + "/metrics", timeout=30).text, name)


def _sample(text: str, name: str) -> float:
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name:
                return s.value
    raise KeyError(name)


def _carries_text(data: str) -> bool:
    """Whether an SSE payload (native or chat chunk) carries generated text; the chat stream
    opens with an empty role-only delta, which is not a first token."""
    if data == "[DONE]":
        return False
    try:
        obj = json.loads(data)
    except json.JSONDecodeError:
        return False
    if "text" in obj:
        return bool(obj["text"])
    choice = (obj.get("choices") or [{}])[0]
    return bool((choice.get("delta") or {}).get("content") or choice.get("text"))


async def soak_client(
    client: httpx.AsyncClient, rng: random.Random, deadline: float, stats: dict, p_drop: float
) -> None:
    """A normal client: streams one request after another; records TTFT (first event with
    text) for every stream and end-to-end latency for completed ones."""
    while time.monotonic() < deadline:
        prompt = " ".join(rng.choice(WORDS) for _ in range(rng.randint(4, 60)))
        max_tokens = rng.randint(1, 48)
        if rng.random() < 0.5:
            path = "/generate"
            body = {
                "text": prompt,
                "sampling_params": {"max_new_tokens": max_tokens},
                "stream": True,
            }
        else:
            path = "/v1/chat/completions"
            body = {
                "model": "m",
                "messages": [{"role": "user", "content": prompt}],
                "max_tokens": max_tokens,
                "stream": True,
            }
        drop_after = rng.randint(0, 6) if rng.random() < p_drop else None
        start = time.perf_counter()
        try:
            async with client.stream("POST", path, json=body) as r:
                stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
                events = 0
                first = False
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events += 1
                        if not first and _carries_text(line[6:]):
                            first = True
                            stats["ttft"].append(time.perf_counter() - start)
                        if drop_after is not None and events > drop_after:
                            stats["dropped"] += 1
                            break
                else:
                    stats["completed"] += 1
                    if r.status_code == 200:
                        stats["e2e"].append(time.perf_counter() - start)
        except httpx.HTTPError as exc:
            stats["transport_errors"].append(repr(exc))


# -- adversarial clients --------------------------------------------------------------------
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
    words = " ".join(WORDS) + " "
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


def split_clients(args: argparse.Namespace) -> tuple[int, int]:
    """(normal, adversarial) clients: --adversarial-share of --clients are adversarial."""
    adversarial = round(args.clients * args.adversarial_share)
    return args.clients - adversarial, adversarial


async def soak_run(
    args: argparse.Namespace, url: str, adversarial: int, shape: ServerShape | None
) -> tuple[dict, list[float]]:
    """Run the clients until the deadline; sample resident memory four times meanwhile. The
    normal clients (and their seeds) are the same whatever `adversarial` is."""
    normal, _ = split_clients(args)
    stats: dict = {
        "status": {}, "dropped": 0, "completed": 0, "transport_errors": [], "e2e": [],
        "ttft": [], "adversarial": {},
    }  # fmt: skip
    deadline = time.monotonic() + args.soak_seconds
    total = normal + adversarial
    limits = httpx.Limits(max_connections=total + 8, max_keepalive_connections=total + 8)
    rss: list[float] = []

    async def sample_memory(client: httpx.AsyncClient) -> None:
        for _ in range(4):
            await asyncio.sleep(args.soak_seconds / 4)
            text = (await client.get("/metrics")).text
            rss.append(_sample(text, "process_resident_memory_bytes"))
            print(
                f"  after {len(rss) * args.soak_seconds / 4:.0f}s: {rss[-1] / 2**20:.0f} MiB",
                flush=True,
            )

    async with httpx.AsyncClient(base_url=url, timeout=300, limits=limits) as client:
        rngs = [random.Random(args.seed * 1000 + i) for i in range(normal)]
        bad = [random.Random(args.seed * 1000 + 500_000 + j) for j in range(adversarial)]
        await asyncio.gather(
            sample_memory(client),
            *(soak_client(client, rng, deadline, stats, args.drop_rate) for rng in rngs),
            *(
                adversarial_client(client, j, rng, deadline, stats, shape, args.adversarial_timeout)
                for j, rng in enumerate(bad)
            ),
        )
    return stats, rss


@dataclass
class SoakResult:
    stats: dict
    rss: list[float]
    flushed: int
    kv_used: int
    growth: float
    grammar_cache_mib: float  # cached compiled grammars just before the flush

    @property
    def status(self) -> dict:
        """Status codes of every request, normal and adversarial."""
        out = dict(self.stats["status"])
        for entry in self.stats["adversarial"].values():
            for code, n in entry["status"].items():
                out[code] = out.get(code, 0) + n
        return out

    @property
    def five_xx(self) -> int:
        return sum(n for code, n in self.status.items() if code >= 500)

    @property
    def adversarial_failures(self) -> int:
        """Adversarial requests past the time bound or with a transport error."""
        return sum(e["timeouts"] + len(e["transport"]) for e in self.stats["adversarial"].values())

    def latency_ms(self, key: str, q: float) -> float:
        return 1000 * _pct(self.stats[key], q)

    @property
    def ok(self) -> bool:
        return (
            self.five_xx == 0
            and self.flushed == 200
            and self.kv_used == 0
            and self.growth < 0.10
            and not self.stats["transport_errors"]
            and self.adversarial_failures == 0
        )


def soak_once(args: argparse.Namespace, url: str, adversarial: int) -> SoakResult:
    """One soak run, then wait for the engine to drain, flush the cache and read the KV pages
    still in use."""
    shape = server_shape(url) if adversarial else None
    rss = [metric(url, "process_resident_memory_bytes")]
    normal, _ = split_clients(args)
    if shape is not None:
        over_pool = "within" if shape.pool_tokens < shape.context_length else "past"
        print(
            f"adversarial prompts: context {shape.context_length} tokens, KV pool "
            f"{shape.pool_tokens} tokens (the over-pool prompt is {over_pool} the context)"
        )
    print(
        f"soak: {normal} clients + {adversarial} adversarial for {args.soak_seconds:.0f}s, "
        "resident memory samples:"
    )
    stats, samples = asyncio.run(soak_run(args, url, adversarial, shape))
    rss += samples
    deadline = time.monotonic() + 120
    while metric(url, "radixflow_num_running_reqs") + metric(url, "radixflow_num_waiting_reqs") > 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    grammar_cache_mib = metric(url, "radixflow_grammar_cache_bytes") / 2**20
    flushed = httpx.post(url + "/flush_cache", timeout=60).status_code
    used = int(metric(url, "radixflow_kv_pages_used"))
    # flat: after the first quarter (allocator and caches warm), growth stays under 10%
    growth = (max(rss[2:]) - rss[1]) / rss[1]
    return SoakResult(stats, rss, flushed, used, growth, grammar_cache_mib)


def _ms(x: float) -> str:
    return f"{x:.0f}"


def _rss(res: SoakResult) -> str:
    return " / ".join(f"{x / 2**20:.0f}" for x in (res.rss[0], res.rss[1], res.rss[-1]))


def soak_rows(res: SoakResult) -> list[list[object]]:
    stats = res.stats
    return [
        ["requests (normal clients)", sum(stats["status"].values())],
        ["completed streams", stats["completed"]],
        ["disconnected mid-stream", stats["dropped"]],
        ["status codes (all)", json.dumps(res.status)],
        ["5xx responses", res.five_xx],
        ["transport errors (normal)", len(stats["transport_errors"])],
        ["normal e2e p50 / p99 ms", f"{_ms(res.latency_ms('e2e', 50))} / {_ms(res.latency_ms('e2e', 99))}"],
        ["normal TTFT p50 / p99 ms", f"{_ms(res.latency_ms('ttft', 50))} / {_ms(res.latency_ms('ttft', 99))}"],
        ["adversarial requests", sum(e["requests"] for e in stats["adversarial"].values())],
        ["adversarial timeouts + transport errors", res.adversarial_failures],
        ["flush_cache after", res.flushed],
        ["KV pages in use after flush", res.kv_used],
        ["RSS start / after 1st quarter / end MiB", _rss(res)],
        ["RSS growth after 1st quarter", f"{100 * res.growth:.1f}%"],
        ["grammar cache MiB before flush", f"{res.grammar_cache_mib:.0f}"],
    ]  # fmt: skip


def print_adversarial(res: SoakResult, bound: float) -> None:
    """Per kind: requests, status codes, finish reasons (of 200s), failures."""
    rows = []
    for name, e in res.stats["adversarial"].items():
        five = sum(n for code, n in e["status"].items() if code >= 500)
        rows.append([
            name, e["requests"], json.dumps(dict(sorted(e["status"].items()))),
            json.dumps(e["finish"]) if e["finish"] else "", five, e["timeouts"],
            len(e["transport"]), f"{e['max_s']:.1f}",
        ])  # fmt: skip
    print(f"adversarial requests (bound {bound:g}s; 0 = the client hung up on purpose):")
    print_table(
        ["kind", "requests", "status codes", "finish", "5xx", "timeouts", "transport", "max s"],
        rows,
    )
    for name, e in res.stats["adversarial"].items():
        if e["transport"]:
            print(f"  {name}: first transport errors: {e['transport'][:2]}")


def soak(args: argparse.Namespace, url: str) -> bool:
    res = soak_once(args, url, split_clients(args)[1])
    print_table(["soak", "value"], soak_rows(res))
    if res.stats["transport_errors"]:
        print("first transport errors:", res.stats["transport_errors"][:3])
    if res.stats["adversarial"]:
        print_adversarial(res, args.adversarial_timeout)
    print("SOAK", "PASSED" if res.ok else "FAILED")
    return res.ok


def compare_adversarial(args: argparse.Namespace, url: str) -> bool:
    """The soak without, then with, the adversarial clients: same server, seed and normal
    clients; the normal clients' latency side by side."""
    if not args.adversarial_share:
        args.adversarial_share = 0.2
    normal, adversarial = split_clients(args)
    runs = {}
    for label, n_adv in (("without", 0), ("with", adversarial)):
        print(f"== soak {label} adversarial clients ==")
        runs[label] = soak_once(args, url, n_adv)
    base, adv = runs["without"], runs["with"]

    def ratio(key: str, q: float) -> str:
        a, b = base.latency_ms(key, q), adv.latency_ms(key, q)
        return f"{b / a:.2f}x" if a > 0 else "n/a"

    rows = []
    for label, key, q in (
        ("normal e2e p50 ms", "e2e", 50),
        ("normal e2e p99 ms", "e2e", 99),
        ("normal TTFT p50 ms", "ttft", 50),
        ("normal TTFT p99 ms", "ttft", 99),
    ):
        rows.append(
            [label, _ms(base.latency_ms(key, q)), _ms(adv.latency_ms(key, q)), ratio(key, q)]
        )
    rows += [
        ["normal requests", sum(base.stats["status"].values()), sum(adv.stats["status"].values()), ""],
        ["normal completed streams", base.stats["completed"], adv.stats["completed"], ""],
        ["adversarial requests", 0, sum(e["requests"] for e in adv.stats["adversarial"].values()), ""],
        ["5xx responses", base.five_xx, adv.five_xx, ""],
        ["transport errors (normal)", len(base.stats["transport_errors"]), len(adv.stats["transport_errors"]), ""],
        ["adversarial timeouts + transport errors", 0, adv.adversarial_failures, ""],
        ["KV pages in use after flush", base.kv_used, adv.kv_used, ""],
        ["RSS start / after 1st quarter / end MiB", _rss(base), _rss(adv), ""],
        ["RSS growth after 1st quarter", f"{100 * base.growth:.1f}%", f"{100 * adv.growth:.1f}%", ""],
        ["grammar cache MiB before flush", f"{base.grammar_cache_mib:.0f}", f"{adv.grammar_cache_mib:.0f}", ""],
    ]  # fmt: skip
    print()
    print(
        f"{normal} normal clients (seed {args.seed}), {adversarial} adversarial clients "
        f"({args.adversarial_share:g} of {args.clients}), {args.soak_seconds:.0f}s per run"
    )
    print_table(["soak", "without adversarial", "with adversarial", "ratio"], rows)
    print_adversarial(adv, args.adversarial_timeout)
    for label, res in runs.items():
        if res.stats["transport_errors"]:
            print(f"first transport errors ({label}):", res.stats["transport_errors"][:3])
    p99_ratio = adv.latency_ms("e2e", 99) / base.latency_ms("e2e", 99)
    within = p99_ratio <= 2.0
    print(f"normal p99 latency with/without adversarial: {p99_ratio:.2f}x (target <= 2x: "
          f"{'met' if within else 'MISSED'})")  # fmt: skip
    ok = base.ok and adv.ok and within
    print("SOAK COMPARISON", "PASSED" if ok else "FAILED")
    return ok


# -- main -------------------------------------------------------------------------------------
def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--url", default=None, help="a running radixflow server (default: start one)"
    )
    parser.add_argument("--port", type=int, default=30123, help="port for the server started here")
    parser.add_argument(
        "--server-args", default="--dtype float32", help="flags for `radixflow serve`"
    )
    parser.add_argument(
        "--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 2.0, 4.0]
    )
    parser.add_argument("--num-prompts", type=int, default=24)
    parser.add_argument("--input-len", type=int, default=64, help="mean prompt length in words")
    parser.add_argument("--output-len", type=int, default=32, help="mean output length in tokens")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--compare-transformers", action="store_true")
    parser.add_argument("--soak", action="store_true", help="run the soak test instead")
    parser.add_argument("--soak-seconds", type=float, default=120.0)
    parser.add_argument("--clients", type=int, default=200)
    parser.add_argument(
        "--drop-rate", type=float, default=0.3, help="share of clients that disconnect"
    )
    parser.add_argument(
        "--adversarial-share", type=float, default=0.0,
        help="share of the soak clients that send adversarial requests (e.g. 0.2)",
    )  # fmt: skip
    parser.add_argument(
        "--adversarial-timeout", type=float, default=60.0,
        help="seconds an adversarial request may take before it counts as hung",
    )  # fmt: skip
    parser.add_argument(
        "--compare-adversarial", action="store_true",
        help="soak twice, without and with the adversarial share (default 0.2), and compare "
        "the normal clients' latencies",
    )  # fmt: skip
    args = parser.parse_args()

    launched: list[Launched] = []
    try:
        url = args.url
        if url is None:
            launched.append(launch_radixflow(args.port, args.server_args.split()))
            url = launched[-1].url
        if args.compare_adversarial:
            return 0 if compare_adversarial(args, url) else 1
        if args.soak:
            return 0 if soak(args, url) else 1
        info = httpx.get(url + "/get_model_info", timeout=30).json()
        servers = [("radixflow", url, info["served_model_name"], {"ignore_eos": True})]
        if args.compare_transformers:
            dtype = httpx.get(url + "/server_info", timeout=30).json()["dtype"]
            peer = launch_transformers(args.port + 1, info["model_path"], dtype)
            if isinstance(peer, str):
                print(f"transformers serve: not compared: {peer}")
            else:
                launched.append(peer)
                servers.append((peer.name, peer.url, info["model_path"], {}))
        load(args, servers)
        if args.compare_transformers and len(servers) > 1:
            print("transformers serve gets no ignore_eos, so its outputs may end early; "
                  "out tok/s counts the tokens each server actually produced")  # fmt: skip
        return 0
    finally:
        for server in launched:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
