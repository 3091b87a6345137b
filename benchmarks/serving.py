"""Online serving benchmark and soak test against a running HTTP server (loopback only).

Load mode: Poisson arrivals at several request rates, seeded random prompt/output lengths,
streaming /v1/completions; prints throughput, TTFT and inter-token latency p50/p99 per rate.
With --compare-transformers the same load runs against `transformers serve` on the same model.

    python benchmarks/serving.py --rates 1,2,4 --num-prompts 24
    python benchmarks/serving.py --soak --soak-seconds 120 --clients 200

Soak mode: `--clients` concurrent streaming clients (mixed /generate and /v1/chat/completions),
a share of which disconnect mid-stream, for a bounded time. It asserts zero 5xx responses,
every KV page free afterwards (after /flush_cache) and resident memory flat.

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


async def soak_client(
    client: httpx.AsyncClient, rng: random.Random, deadline: float, stats: dict, p_drop: float
) -> None:
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
        try:
            async with client.stream("POST", path, json=body) as r:
                stats["status"][r.status_code] = stats["status"].get(r.status_code, 0) + 1
                events = 0
                async for line in r.aiter_lines():
                    if line.startswith("data: "):
                        events += 1
                        if drop_after is not None and events > drop_after:
                            stats["dropped"] += 1
                            break
                else:
                    stats["completed"] += 1
        except httpx.HTTPError as exc:
            stats["transport_errors"].append(repr(exc))


async def soak_run(args: argparse.Namespace, url: str) -> tuple[dict, list[float]]:
    """Run the clients until the deadline; sample resident memory four times meanwhile."""
    stats: dict = {"status": {}, "dropped": 0, "completed": 0, "transport_errors": []}
    deadline = time.monotonic() + args.soak_seconds
    limits = httpx.Limits(
        max_connections=args.clients + 8, max_keepalive_connections=args.clients + 8
    )
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
        rngs = [random.Random(args.seed * 1000 + i) for i in range(args.clients)]
        await asyncio.gather(
            sample_memory(client),
            *(soak_client(client, rng, deadline, stats, args.drop_rate) for rng in rngs),
        )
    return stats, rss


def soak(args: argparse.Namespace, url: str) -> bool:
    rss = [metric(url, "process_resident_memory_bytes")]
    print(f"soak: {args.clients} clients for {args.soak_seconds:.0f}s, resident memory samples:")
    stats, samples = asyncio.run(soak_run(args, url))
    rss += samples
    deadline = time.monotonic() + 120
    while metric(url, "radixflow_num_running_reqs") + metric(url, "radixflow_num_waiting_reqs") > 0:
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    flushed = httpx.post(url + "/flush_cache", timeout=60).status_code
    used = metric(url, "radixflow_kv_pages_used")
    status = stats["status"]
    five_xx = sum(n for code, n in status.items() if code >= 500)
    transport = stats["transport_errors"]
    # flat: after the first quarter (allocator and caches warm), growth stays under 10%
    growth = (max(rss[2:]) - rss[1]) / rss[1]
    rows = [
        ["requests", sum(status.values())],
        ["completed streams", stats["completed"]],
        ["disconnected mid-stream", stats["dropped"]],
        ["status codes", json.dumps(status)],
        ["5xx responses", five_xx],
        ["transport errors", len(transport)],
        ["flush_cache after", flushed],
        ["KV pages in use after flush", int(used)],
        [
            "RSS start / after 1st quarter / end MiB",
            " / ".join(f"{x / 2**20:.0f}" for x in (rss[0], rss[1], rss[-1])),
        ],
        ["RSS growth after 1st quarter", f"{100 * growth:.1f}%"],
    ]
    print_table(["soak", "value"], rows)
    if transport:
        print("first transport errors:", transport[:3])
    ok = five_xx == 0 and flushed == 200 and used == 0 and growth < 0.10 and not transport
    print("SOAK", "PASSED" if ok else "FAILED")
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
    args = parser.parse_args()

    launched: list[Launched] = []
    try:
        url = args.url
        if url is None:
            launched.append(launch_radixflow(args.port, args.server_args.split()))
            url = launched[-1].url
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
