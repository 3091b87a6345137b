"""radixflow against llama.cpp on the same GGUF, on this CPU: prefill, batch-1 decode, and
throughput with many requests at once. Both run as HTTP servers on loopback with the same
number of threads (torch's default, one per core) and are measured by the same client code:

  prefill tok/s      a fresh 512-token prompt, one output token (median of 3 prompts)
  decode tok/s       128 / (time for 129 output tokens - time for 1), after a 16-token prompt
  N concurrent       N clients at once, each a fresh 128-token prompt and 128 output tokens
                     (ignore_eos); output tokens / wall time; llama.cpp gets N parallel slots

The batch-1 bound is the memory bandwidth measured here (`common.memory_bandwidth`: the
faster of a read and a copy of 256 MiB) divided by the bytes of the GGUF's tensors: a decode
step reads every weight once. llama.cpp comes from `make llama-cpp` (builds llama-server from PyPI's
llama-cpp-python source into build/llama.cpp); without it only radixflow's rows are printed.

    make llama-cpp
    python benchmarks/cpu_peer.py [--gguf PATH] [--concurrency 16 64] \\
        [--radixflow-flags "--quantization auto" "--quantization none"]
"""

from __future__ import annotations

import argparse
import asyncio
import random
import shlex
import socket
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import httpx
import torch
from gguf import GGUFReader

sys.path.insert(0, str(Path(__file__).parent))
from common import memory_bandwidth, print_table  # noqa: E402
from serving import Launched, launch_radixflow, wait_ready  # noqa: E402

from radixflow.runtime.model_loader import default_model_path  # noqa: E402

LLAMA_SERVER = (
    Path(__file__).resolve().parent.parent / "build" / "llama.cpp" / "bin" / "llama-server"
)
PREFILL_TOKENS = 512
DECODE_TOKENS = 128
CONCURRENT_PROMPT = 128


@dataclass(frozen=True)
class Server:
    """How to ask one server for a completion of token ids, and how many tokens came back."""

    name: str
    launched: Launched
    body: Callable[[list[int], int], dict]
    route: str
    count: Callable[[dict], int]


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def radixflow_server(gguf: Path, flags: list[str], label: str) -> Server:
    launched = launch_radixflow(free_port(), ["--model-path", str(gguf), *flags])
    return Server(
        f"radixflow {label}".strip(),
        launched,
        lambda ids, n: {
            "input_ids": ids,
            "sampling_params": {"max_new_tokens": n, "temperature": 0, "ignore_eos": True},
        },
        "/generate",
        lambda out: out["meta_info"]["completion_tokens"],
    )


def llama_server(gguf: Path, threads: int, slots: int, context: int) -> Server:
    port = free_port()
    cmd = [str(LLAMA_SERVER), "-m", str(gguf), "--host", "127.0.0.1", "--port", str(port)]
    cmd += ["-t", str(threads), "-np", str(slots), "-c", str(context * slots), "--log-disable"]
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    wait_ready(url, "/health", proc, 300)
    return Server(
        f"llama.cpp ({slots} slots)",
        Launched("llama.cpp", url, proc),
        lambda ids, n: {
            "prompt": ids,
            "n_predict": n,
            "temperature": 0,
            "ignore_eos": True,
            "cache_prompt": False,
        },
        "/completion",
        lambda out: out["tokens_predicted"],
    )


def fresh_prompt(rng: random.Random, length: int) -> list[int]:
    # ids well inside every vocabulary of the default model's size, away from special tokens
    return [rng.randrange(1000, 40000) for _ in range(length)]


async def timed(client: httpx.AsyncClient, server: Server, ids: list[int], n: int) -> float:
    start = time.perf_counter()
    resp = await client.post(server.launched.url + server.route, json=server.body(ids, n))
    resp.raise_for_status()
    got = server.count(resp.json())
    if got != n:
        raise RuntimeError(f"{server.name} returned {got} tokens, asked for {n}")
    return time.perf_counter() - start


async def measure(server: Server, concurrency: list[int], seed: int) -> dict[str, float]:
    rng = random.Random(seed)
    out: dict[str, float] = {}
    async with httpx.AsyncClient(timeout=600) as client:
        await timed(client, server, fresh_prompt(rng, 16), 4)  # warm-up
        prefill = [
            await timed(client, server, fresh_prompt(rng, PREFILL_TOKENS), 1) for _ in range(3)
        ]
        out["prefill"] = PREFILL_TOKENS / statistics.median(prefill)
        decode = []
        for _ in range(3):
            prompt = fresh_prompt(rng, 16)
            first = await timed(client, server, prompt, 1)
            whole = await timed(client, server, prompt, DECODE_TOKENS + 1)
            decode.append(DECODE_TOKENS / (whole - first))
        out["decode"] = statistics.median(decode)
        for n in concurrency:
            prompts = [fresh_prompt(rng, CONCURRENT_PROMPT) for _ in range(n)]
            start = time.perf_counter()
            await asyncio.gather(*(timed(client, server, p, DECODE_TOKENS) for p in prompts))
            out[f"c{n}"] = n * DECODE_TOKENS / (time.perf_counter() - start)
    return out


def gguf_tensor_bytes(gguf: Path) -> int:
    return sum(int(t.n_bytes) for t in GGUFReader(gguf).tensors)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--gguf", type=Path, default=None, help="default: the default model")
    parser.add_argument(
        "--threads", type=int, default=torch.get_num_threads(), help="llama.cpp's -t"
    )
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16, 64])
    parser.add_argument(
        "--radixflow-flags",
        nargs="+",
        default=["--quantization auto", "--quantization none"],
        help="one radixflow server per entry, with these extra flags",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    gguf = args.gguf or default_model_path()

    bandwidth = memory_bandwidth()
    weight_bytes = gguf_tensor_bytes(gguf)
    bound = bandwidth / weight_bytes
    print(
        f"{gguf.name}: {weight_bytes / 2**20:.0f} MiB of tensors; memory bandwidth "
        f"{bandwidth / 1e9:.1f} GB/s; batch-1 decode bound {bound:.0f} tok/s; "
        f"{args.threads} threads"
    )

    context = CONCURRENT_PROMPT + DECODE_TOKENS + PREFILL_TOKENS
    makers: list[Callable[[], Server]] = [
        (lambda f=flags: radixflow_server(gguf, shlex.split(f), f))
        for flags in args.radixflow_flags
    ]
    if LLAMA_SERVER.exists():
        makers.append(lambda: llama_server(gguf, args.threads, max(args.concurrency), context))
    else:
        print(f"llama.cpp not built ({LLAMA_SERVER} missing): run `make llama-cpp`")

    results: dict[str, dict[str, float]] = {}
    for make in makers:
        server = make()
        try:
            results[server.name] = asyncio.run(measure(server, args.concurrency, args.seed))
        finally:
            server.launched.stop()

    peer = next((r for name, r in results.items() if name.startswith("llama.cpp")), None)
    headers = ["engine", "prefill tok/s", "decode tok/s", "decode / bound"]
    headers += [f"{n} concurrent tok/s" for n in args.concurrency]
    rows = []
    for name, r in results.items():
        row = [name, f"{r['prefill']:.0f}", f"{r['decode']:.1f}", f"{r['decode'] / bound:.0%}"]
        row += [f"{r[f'c{n}']:.0f}" for n in args.concurrency]
        rows.append(row)
        if peer is not None and r is not peer:
            ratio = [f"{name} / llama.cpp", f"{r['prefill'] / peer['prefill']:.2f}x"]
            ratio += [f"{r['decode'] / peer['decode']:.2f}x", ""]
            ratio += [f"{r[f'c{n}'] / peer[f'c{n}']:.2f}x" for n in args.concurrency]
            rows.append(ratio)
    print()
    print_table(headers, rows)


if __name__ == "__main__":
    main()
