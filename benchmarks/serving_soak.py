"""The serving soak test: streaming clients (some adversarial) for a bounded time, then checks.

Run through `serving.py --soak` / `--compare-adversarial` (see its docstring for what is
asserted).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

sys.path.insert(0, str(Path(__file__).parent))
from common import SERVING_WORDS, percentile, print_table  # noqa: E402
from serving_adversarial import ServerShape, adversarial_client, server_shape  # noqa: E402


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
        prompt = " ".join(rng.choice(SERVING_WORDS) for _ in range(rng.randint(4, 60)))
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
        return 1000 * percentile(self.stats[key], q)

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
