"""`radixflow serve | run | bench`: the command line. Engine flags come from `EngineConfig`.

    radixflow serve --model PATH --host 127.0.0.1 --port 30000 [--api-key KEY] [engine flags]
    radixflow run "The capital of France is" --max-new-tokens 16 [--chat] [engine flags]
    radixflow bench --num-prompts 32 --input-len 128 --output-len 64 [engine flags]

Every `EngineConfig` field is a flag (`page_size` -> `--page-size`) with the field's default,
help text and choices; booleans also get a `--no-` form. SGLang's `launch_server` spellings
work too (`--tp-size 1`, `--dtype half`, `--attention-backend torch_native`, ...): the table
is in `radixflow.runtime.config`.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import random
import sys
import time
import types
import typing
from typing import Any

from radixflow.runtime.chat_templates import check_template_kwargs, render_chat
from radixflow.runtime.config import (
    SGLANG_IGNORED,
    SGLANG_RENAMES,
    SGLANG_VALUES,
    EngineConfig,
    check_sglang_option,
    sglang_value,
)
from radixflow.runtime.server.limits import CHARS_PER_TOKEN, ServerLimits

_SCALARS = {"int": int, "float": float, "str": str, "bool": bool}


def add_engine_flags(parser: argparse.ArgumentParser, own: frozenset[str] = frozenset()) -> None:
    """One flag per `EngineConfig` field; unset flags keep the config's default. SGLang flags
    named in `own` are left to the command (serve has its own --dp-size)."""
    group = parser.add_argument_group("engine")
    hints = typing.get_type_hints(EngineConfig)
    renamed = {ours: sglang for sglang, ours in SGLANG_RENAMES.items()}
    for f in dataclasses.fields(EngineConfig):
        kind = _scalar(hints[f.name])
        flags = [_flag(f.name)]
        if f.name == "model_path":
            flags.append("--model")
        if f.name in renamed:
            flags.append(_flag(renamed[f.name]))
        choices = f.metadata.get("choices")
        if choices:  # SGLang's spellings of the values too (`--dtype half`)
            choices = (*choices, *SGLANG_VALUES.get(f.name, {}))
        help_text = f.metadata["help"].replace("%", "%%")  # argparse formats help with %
        if f.default is not None:
            help_text += f" (default: {f.default})"
        if kind is bool:
            group.add_argument(
                *flags, dest=f.name, action=argparse.BooleanOptionalAction, default=f.default,
                help=help_text,
            )  # fmt: skip
        else:
            group.add_argument(
                *flags, dest=f.name, type=kind, default=f.default,
                choices=choices, help=help_text,
                metavar=f.name.upper() if not choices else None,
            )  # fmt: skip
    ignored = parser.add_argument_group("SGLang flags accepted for compatibility")
    for name, (takes_value, why) in SGLANG_IGNORED.items():
        if name in own:
            continue
        ignored.add_argument(
            _flag(name), dest=f"sglang_{name}", default=None, help=why.replace("%", "%%"),
            **({"metavar": "VALUE"} if takes_value else {"action": "store_const", "const": True}),
        )  # fmt: skip


def _flag(name: str) -> str:
    return f"--{name.replace('_', '-')}"


def engine_kwargs(args: argparse.Namespace) -> dict[str, Any]:
    """The `EngineConfig` fields out of parsed arguments (SGLang's values translated); SGLang
    flags that do not apply here are logged, or raise when their value needs what is absent."""
    for name in SGLANG_IGNORED:
        value = getattr(args, f"sglang_{name}", None)
        if value is not None:
            check_sglang_option(name, value)
    return {
        f.name: sglang_value(f.name, getattr(args, f.name))
        for f in dataclasses.fields(EngineConfig)
    }


def _scalar(hint: Any) -> type:
    """int for `int`, `int | None` and `Optional[int]`; likewise float, str, bool."""
    if isinstance(hint, types.UnionType) or typing.get_origin(hint) is typing.Union:
        args = [a for a in typing.get_args(hint) if a is not type(None)]
        if len(args) != 1:
            raise TypeError(f"EngineConfig field type {hint} has no flag form")
        hint = args[0]
    if hint not in _SCALARS.values():
        raise TypeError(f"EngineConfig field type {hint} has no flag form")
    return hint


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="radixflow", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)

    serve = sub.add_parser("serve", help="serve the HTTP API (SGLang-native and OpenAI)")
    serve.add_argument("--host", default="127.0.0.1", help="address to bind (default: loopback)")
    serve.add_argument("--port", type=int, default=30000)
    serve.add_argument("--api-key", default=None, help="require 'Authorization: Bearer KEY'")
    serve.add_argument(
        "--admin-api-key", default=None,
        help="key for the admin routes (/flush_cache, abort_all); when set, the API key does "
        "not open them",
    )  # fmt: skip
    limits = ServerLimits()
    serve.add_argument(
        "--max-body-bytes", type=int, default=limits.max_body_bytes,
        help=f"largest request body accepted (default: {limits.max_body_bytes})",
    )  # fmt: skip
    serve.add_argument(
        "--max-prompt-chars", type=int, default=None,
        help=f"longest prompt text accepted, checked before tokenizing (default: "
        f"{CHARS_PER_TOKEN} x the context length)",
    )  # fmt: skip
    serve.add_argument(
        "--max-requests-per-call", type=int, default=limits.max_requests_per_call,
        help="most generations (prompts x n) one HTTP request may ask for (default: "
        f"{limits.max_requests_per_call})",
    )  # fmt: skip
    serve.add_argument(
        "--cors-origin", action="append", dest="cors_origins", default=None,
        help="allow cross-origin requests from this origin (repeatable; off by default)",
    )  # fmt: skip
    serve.add_argument(
        "--served-model-name", nargs="+", default=None,
        help="model id in /v1 responses; more names are aliases a request may also give",
    )  # fmt: skip
    _add_log_level(serve)
    serve.add_argument(
        "--graceful-timeout", type=float, default=30.0,
        help="seconds to let in-flight requests finish on shutdown before aborting them",
    )  # fmt: skip
    serve.add_argument(
        "--dp-size", type=int, default=1,
        help="engine replicas on this machine behind SGLang's cache-aware router, each with "
        "cores/N threads (or one GPU each); needs pip install 'radixflow[router]' (default: 1)",
    )  # fmt: skip
    add_engine_flags(serve, own=frozenset({"dp_size"}))

    run = sub.add_parser("run", help="generate for one prompt and print it as it streams")
    run.add_argument("prompt")
    run.add_argument(
        "--chat", action="store_true",
        help="send the prompt as a user message through the chat template (the model's, or "
        "--chat-template's), as the server's chat route does",
    )  # fmt: skip
    run.add_argument(
        "--chat-template-kwargs", type=_json_object, default=None, metavar="JSON",
        help='with --chat: extra template variables, e.g. \'{"enable_thinking": false}\'',
    )  # fmt: skip
    run.add_argument("--max-new-tokens", type=int, default=128)
    run.add_argument("--temperature", type=float, default=0.0)
    run.add_argument("--top-p", type=float, default=1.0)
    run.add_argument("--top-k", type=int, default=-1)
    run.add_argument("--seed", type=int, default=None)
    run.add_argument("--regex", default=None, help="constrain the output to this regex")
    run.add_argument("--json-schema", default=None, help="constrain the output to this schema")
    _add_log_level(run, "warning")
    add_engine_flags(run)

    bench = sub.add_parser("bench", help="offline throughput on random prompts (no HTTP)")
    bench.add_argument("--num-prompts", type=int, default=32)
    bench.add_argument("--input-len", type=int, default=128)
    bench.add_argument("--output-len", type=int, default=64)
    bench.add_argument("--bench-seed", type=int, default=0, help="seed of the random prompts")
    _add_log_level(bench, "warning")
    add_engine_flags(bench)
    return parser


def _json_object(text: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise argparse.ArgumentTypeError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("must be a JSON object")
    return value


def _add_log_level(parser: argparse.ArgumentParser, default: str = "info") -> None:
    parser.add_argument(
        "--log-level", default=default, choices=["debug", "info", "warning", "error", "critical"],
        help=f"level of radixflow's loggers and the HTTP server's (default: {default})",
    )  # fmt: skip


def configure_logging(level: str) -> None:
    """Send radixflow's own loggers to stderr at `level` (the startup summary, requests)."""
    logging.basicConfig(format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("radixflow").setLevel(level.upper())


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    try:
        if args.command == "serve" and args.node_rank != 0:
            return _serve_workers(args)
        if args.command == "serve" and args.dp_size != 1:
            return _serve_replicas(args, argv)
        return {"serve": _serve, "run": _run, "bench": _bench}[args.command](args)
    except ValueError as exc:
        print(f"radixflow: error: {exc}", file=sys.stderr)
        return 2


def _serve(args: argparse.Namespace) -> int:
    from radixflow.runtime.server.launch import serve

    return serve(
        engine_kwargs(args),
        args.host,
        args.port,
        api_key=args.api_key,
        admin_api_key=args.admin_api_key,
        limits=ServerLimits(
            max_body_bytes=args.max_body_bytes,
            max_prompt_chars=args.max_prompt_chars,
            max_requests_per_call=args.max_requests_per_call,
        ),
        cors_origins=args.cors_origins,
        served_model_name=args.served_model_name,
        log_level=args.log_level,
        graceful_timeout=args.graceful_timeout,
    )


def _serve_workers(args: argparse.Namespace) -> int:
    """--node-rank R > 0: this machine runs only its tensor-parallel worker ranks (no HTTP
    server) until node 0's engine stops them."""
    from radixflow.runtime.distributed.worker import run_node

    return run_node(EngineConfig(**engine_kwargs(args)))


def _serve_replicas(args: argparse.Namespace, argv: list[str]) -> int:
    """--dp-size N: N `radixflow serve` replicas with these options behind SGLang's router."""
    from radixflow.runtime.server.data_parallel import (
        ReplicaPlan,
        Supervisor,
        check_router_installed,
    )

    if args.dp_size < 1:
        raise ValueError(f"--dp-size must be >= 1, got {args.dp_size}")
    if args.tp_size != 1 or args.nnodes != 1:
        raise ValueError("--dp-size with --tp-size/--nnodes is not supported: pick one")
    check_router_installed(args.dp_size)
    if args.admin_api_key is not None:
        raise ValueError(
            "--admin-api-key with --dp-size: the router sends one key (--api-key) to the "
            "replicas, so admin routes would be unreachable through it"
        )
    config = EngineConfig(**engine_kwargs(args))  # bad options fail here, before N replicas do
    plan = ReplicaPlan(
        dp_size=args.dp_size,
        host=args.host,
        port=args.port,
        worker_argv=argv,
        num_threads=config.num_threads,
        device=config.device,
        mem_fraction_static=config.mem_fraction_static,
        api_key=args.api_key,
        cors_origins=args.cors_origins,
        log_level=args.log_level,
        graceful_timeout=args.graceful_timeout,
    )
    return Supervisor(plan).run()


def _run(args: argparse.Namespace) -> int:
    from radixflow.runtime.engine import Engine

    params: dict[str, Any] = {
        "max_new_tokens": args.max_new_tokens,
        "temperature": args.temperature,
        "top_p": args.top_p,
        "top_k": args.top_k,
    }
    for name in ("seed", "regex", "json_schema"):
        if getattr(args, name) is not None:
            params[name] = getattr(args, name)
    if args.chat_template_kwargs is not None and not args.chat:
        raise ValueError("--chat-template-kwargs needs --chat")
    check_template_kwargs(args.chat_template_kwargs)
    with Engine(**engine_kwargs(args)) as engine:
        prompt = args.prompt
        if args.chat:  # the chat route's rendering: the engine's tokenizer has the override
            prompt = render_chat(
                engine.tokenizer,
                [{"role": "user", "content": prompt}],
                template_kwargs=args.chat_template_kwargs,
            )
        ids = engine.tokenizer.encode(prompt, add_special_tokens=not args.chat)
        shown = 0
        for out in engine.generate(input_ids=ids, sampling_params=params, stream=True):
            sys.stdout.write(out["text"][shown:])
            sys.stdout.flush()
            shown = len(out["text"])
        meta = out["meta_info"]
        print(
            f"\n[{meta['completion_tokens']} tokens, {meta['e2e_latency']:.2f}s, "
            f"finish: {json.dumps(meta['finish_reason'])}]",
            file=sys.stderr,
        )
    return 0


def _bench(args: argparse.Namespace) -> int:
    """Submit every prompt at once and time it: request and token throughput, no HTTP."""
    from radixflow.runtime.engine import Engine

    with Engine(**engine_kwargs(args)) as engine:
        rng = random.Random(args.bench_seed)
        prompts = [
            [rng.randrange(100, engine.vocab_size) for _ in range(args.input_len)]
            for _ in range(args.num_prompts)
        ]
        params = {"max_new_tokens": args.output_len, "ignore_eos": True, "temperature": 0}
        engine.generate(input_ids=prompts[0][:8], sampling_params={"max_new_tokens": 2})
        start = time.perf_counter()
        results = engine.generate(input_ids=prompts, sampling_params=params)
        elapsed = time.perf_counter() - start
    out_tokens = sum(r["meta_info"]["completion_tokens"] for r in results)
    in_tokens = args.num_prompts * args.input_len
    print(f"prompts: {args.num_prompts} x {args.input_len} tokens in, {args.output_len} out")
    print(f"elapsed: {elapsed:.2f} s")
    print(f"requests/s: {args.num_prompts / elapsed:.2f}")
    print(f"output tokens/s: {out_tokens / elapsed:.1f}")
    print(f"total tokens/s: {(in_tokens + out_tokens) / elapsed:.1f}")
    return 0
