"""Online serving benchmark and soak test against a running HTTP server (loopback only).

Load mode: Poisson arrivals at several request rates, seeded random prompt/output lengths,
streaming /v1/completions; prints throughput, TTFT and inter-token latency p50/p99 per rate.
With --compare-transformers the same load runs against `transformers serve` on the same model;
with --dp N against one server and against `radixflow serve --dp-size N` (N replicas behind
SGLang's router, the `router` extra), and with --tp N against one server and against
`radixflow serve --tp-size N` (one server, the model sharded over N ranks), all started here
with the same --server-args.

    python benchmarks/serving.py --rates 1,2,4 --num-prompts 24
    python benchmarks/serving.py --rates 2,4 --dp 2
    python benchmarks/serving.py --rates 2,4 --tp 2
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
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

import httpx

sys.path.insert(0, str(Path(__file__).parent))
from common import SERVING_WORDS, percentile, print_table  # noqa: E402
from serving_soak import compare_adversarial, soak  # noqa: E402


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


def wait_ready(url: str, health: str, proc: subprocess.Popen, timeout: float) -> None:
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


def launch_radixflow(port: int, extra: list[str], dp_size: int = 1, tp_size: int = 1) -> Launched:
    cmd = [sys.executable, "-m", "radixflow", "serve", "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["--log-level", "warning", *extra, "--dp-size", str(dp_size), "--tp-size", str(tp_size)]
    proc = subprocess.Popen(cmd)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, "/health", proc, 300)
    if tp_size > 1:
        return Launched(f"radixflow tp={tp_size}", url, proc)
    if dp_size == 1:
        return Launched("radixflow", url, proc)
    _wait_registered(url, dp_size, proc, 300)
    return Launched(f"radixflow dp={dp_size}", url, proc)


def _wait_registered(url: str, replicas: int, proc: subprocess.Popen, timeout: float) -> None:
    """Until the router lists every replica (it answers /health before that)."""
    deadline = time.monotonic() + timeout
    while len(httpx.get(url + "/get_loads", timeout=5).json()["workers"]) < replicas:
        if proc.poll() is not None or time.monotonic() > deadline:
            raise RuntimeError(f"the router at {url} did not register {replicas} replicas")
        time.sleep(0.5)


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
        wait_ready(url, "/health", proc, 300)
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
        prompt = " ".join(rng.choice(SERVING_WORDS) for _ in range(words))
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
        f"{1000 * percentile(ttfts, 50):.0f}",
        f"{1000 * percentile(ttfts, 99):.0f}",
        f"{1000 * percentile(itls, 50):.0f}",
        f"{1000 * percentile(itls, 99):.0f}",
    ]


HEADERS = ["server", "req/s in", "ok", "req/s", "out tok/s", "TTFT p50 ms", "TTFT p99 ms",
           "ITL p50 ms", "ITL p99 ms"]  # fmt: skip


def load(args: argparse.Namespace, servers: list[tuple[str, str, str, dict]]) -> list[list[object]]:
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
    return rows


def print_ratios(rows: list[list[object]], name: str) -> None:
    """Server `name`'s figures over one plain server's, per request rate (same load, same
    prompts)."""
    by_key = {(row[0], row[1]): row for row in rows}
    for (server, rate), row in by_key.items():
        one = by_key.get(("radixflow", rate))
        if server != name or one is None:
            continue
        ratios = [
            f"{HEADERS[i]} x{float(str(row[i])) / float(str(one[i])):.2f}"
            for i in (3, 4, 5, 7)  # req/s, out tok/s, TTFT p50, ITL p50
            if float(str(one[i])) > 0
        ]
        print(f"{name} / one server at {rate} req/s: {', '.join(ratios)}")


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
    parser.add_argument(
        "--dp", type=int, default=None, metavar="N",
        help="run the load against one server and against `--dp-size N` replicas (both "
        "started here)",
    )  # fmt: skip
    parser.add_argument(
        "--tp", type=int, default=None, metavar="N",
        help="run the load against one server and against one with `--tp-size N` (both "
        "started here)",
    )  # fmt: skip
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
    for flag, value in (("--dp", args.dp), ("--tp", args.tp)):
        if value is not None and (args.url or args.soak or args.compare_adversarial):
            parser.error(f"{flag} starts its own servers for the load mode: not with --url, "
                         "--soak or --compare-adversarial")  # fmt: skip
        if value is not None and value < 2:
            parser.error(f"{flag} needs N >= 2 (N = 1 is the plain server), got {value}")

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
        compared = []  # the parallel servers, each set beside the plain one
        for offset, dp_size, tp_size in ((2, args.dp or 1, 1), (3, 1, args.tp or 1)):
            if dp_size == tp_size == 1:
                continue
            other = launch_radixflow(args.port + offset, args.server_args.split(), dp_size, tp_size)
            launched.append(other)
            compared.append(other.name)
            servers.append((other.name, other.url, info["served_model_name"], {"ignore_eos": True}))
        if args.compare_transformers:
            dtype = httpx.get(url + "/server_info", timeout=30).json()["dtype"]
            # a GGUF's converted folder holds packed weights: transformers loads its float twin
            from radixflow.runtime.model_loader import resolve_model_dir, transformers_dir

            hf_dir = str(transformers_dir(resolve_model_dir(info["model_path"])))
            peer = launch_transformers(args.port + 1, hf_dir, dtype)
            if isinstance(peer, str):
                print(f"transformers serve: not compared: {peer}")
            else:
                launched.append(peer)
                servers.append((peer.name, peer.url, info["model_path"], {}))
        rows = load(args, servers)
        for name in compared:
            print_ratios(rows, name)
        if args.compare_transformers and len(servers) > 1:
            print("transformers serve gets no ignore_eos, so its outputs may end early; "
                  "out tok/s counts the tokens each server actually produced")  # fmt: skip
        return 0
    finally:
        for server in launched:
            server.stop()


if __name__ == "__main__":
    sys.exit(main())
