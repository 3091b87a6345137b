"""Every engine knob, with its default and help text, in one place (the CLI is generated from it).

SGLang's `launch_server` spellings are accepted too, by the CLI and by
`EngineConfig.from_kwargs` (which `rf.Runtime(**kwargs)` uses), through one table:

| SGLang flag | here |
|---|---|
| --model-path, --tokenizer-path, --dtype, --device, --page-size, --context-length, --max-running-requests, --max-total-tokens, --mem-fraction-static, --chunked-prefill-size, --max-prefill-tokens, --schedule-policy, --disable-radix-cache, --random-seed, --chat-template, --tool-call-parser, --reasoning-parser, --log-requests, --tp-size, --nnodes, --node-rank, --dist-init-addr, --dist-timeout | the same knob |
| --dtype half / float / bfloat16 | float16 / float32 / bfloat16 |
| --attention-backend torch_native / triton | torch / triton (others: error) |
| --speculative-algorithm NGRAM / STANDALONE | ngram / draft (EAGLE*: error) |
| --speculative-draft-model-path, --speculative-num-draft-tokens | speculative_draft_model, speculative_num_tokens |
| --host, --port, --api-key, --served-model-name, --log-level | server options (`radixflow serve`) |
| --dp-size | `radixflow serve --dp-size N`: N replicas behind SGLang's router; elsewhere only 1 |
| --pp-size | only 1 (anything else: error) |
| --kv-cache-dtype | only auto (error otherwise) |
| --quantization | the same knob: auto, none, int8, int4, q8_0, q4_0, q4_1 (awq, fp8, ...: error) |
| --grammar-backend xgrammar / llguidance | the same knob (outlines, none: error) |
| --enable-metrics, --enable-cache-report | accepted, logged: always on here |
| --trust-remote-code, --disable-cuda-graph, --cuda-graph-max-bs, --cuda-graph-bs, --enable-torch-compile, --torch-compile-max-bs, --disable-overlap-schedule, --enable-mixed-chunk, --skip-server-warmup, --stream-interval, --watchdog-timeout, --decode-log-interval, --log-level-http, --disable-custom-all-reduce, --sampling-backend, --load-format | accepted, logged as ignored: they tune machinery this engine does not have |

Any other SGLang flag is an unknown option: an error naming it.
"""

from __future__ import annotations

import dataclasses
import difflib
import logging
from dataclasses import dataclass, field
from typing import Any

from radixflow.grammars import GrammarLimits
from radixflow.grammars.budget import JSON_KEY_ORDERS
from radixflow.grammars.compiler import DEFAULT_CACHE_MB

logger = logging.getLogger(__name__)

_GRAMMAR = GrammarLimits()  # the grammar_<limit> knobs' defaults


def _knob(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


def parse_gc_threshold(value: str | list[int] | tuple[int, ...]) -> tuple[int, ...]:
    """'gen0[,gen1[,gen2]]' (or a list of ints) as the ints `gc.set_threshold` takes."""
    if isinstance(value, list | tuple):
        got = tuple(value) if all(type(p) is int for p in value) else ()
    else:
        parts = str(value).replace(",", " ").split()
        got = tuple(int(p) for p in parts) if all(p.isdigit() for p in parts) else ()
    if not 1 <= len(got) <= 3 or min(got) < 0:
        raise ValueError(
            f"gc_threshold must be 1 to 3 integers >= 0 ('gen0[,gen1[,gen2]]'), got {value!r}"
        )
    return got


@dataclass
class EngineConfig:
    model_path: str | None = _knob(
        None, "HF folder, .gguf file or hub id (from the HF cache); default: SmolLM2-135M-Instruct"
    )
    tokenizer_path: str | None = _knob(
        None, "folder (or hub id) of the tokenizer, when it is not the model's own"
    )
    chat_template: str | None = _knob(
        None,
        "chat template overriding the model's: a jinja file, a JSON file with a chat_template "
        "key, or a built-in name (chatml, llama-2, llama-3, mistral, gemma, qwen)",
    )
    generation_config: str = _knob(
        "auto",
        "sampling defaults and extra EOS ids: auto reads the model's generation_config.json, "
        "a folder reads that folder's, vllm or none ignores it",
    )
    tool_call_parser: str | None = _knob(
        None,
        "parse the model's own tool-call format into OpenAI tool_calls (tool_choice auto)",
        ("llama3", "hermes", "qwen25", "qwen3", "mistral"),
    )
    reasoning_parser: str | None = _knob(
        None,
        "move <think>...</think> reasoning into reasoning_content",
        ("deepseek-r1", "qwen3"),
    )
    log_requests: bool = _knob(False, "log each request: rid, prompt tokens, params, finish")
    dtype: str = _knob(
        "auto", "weight and activation dtype", ("auto", "float32", "bfloat16", "float16")
    )
    quantization: str = _knob(
        "auto",
        "weights kept packed in ggml blocks: auto keeps a GGUF's Q8_0/Q4_0/Q4_1/Q4_K/Q6_K "
        "matrices packed where a quantized kernel runs them; none dequantizes at load; int8 "
        "(q8_0) / int4 (q4_1) / q8_0 / q4_0 / q4_1 quantize the projections at load "
        "(embedding and lm_head to q8_0)",
        ("auto", "none", "int8", "int4", "q8_0", "q4_0", "q4_1"),
    )
    quant_activations: str = _knob(
        "float",
        "x of the CPU kernels' packed-weight matmuls: float keeps it in fp32 (the dequantized "
        "model's results; a cached prefix gives the same logits as a fresh one); int8 rounds "
        "it per block of 32 and multiplies in int8 as llama.cpp does (less arithmetic, but the "
        "rounding amplifies fp32 differences between paths: results move by ~0.1 logprob)",
        ("float", "int8"),
    )
    device: str = _knob("auto", "torch device: auto picks cuda when available, else cpu")
    page_size: int = _knob(1, "tokens per KV page")
    max_total_tokens: int | None = _knob(
        None,
        "KV pool size in tokens (default: what mem_fraction_static leaves after the weights, "
        "at most max_running_requests full contexts)",
    )
    mem_fraction_static: float = _knob(
        0.85,
        "fraction of the memory available at start (free GPU memory; on the CPU available RAM "
        "within the cgroup limit) for weights + KV pool; on the CPU the pool's pages are taken "
        "only as tokens fill them",
    )
    context_length: int | None = _knob(None, "maximum tokens per request (default: the model's)")
    max_running_requests: int = _knob(128, "requests decoded together at most")
    chunked_prefill_size: int = _knob(
        512, "prompt tokens prefilled per step (long prompts are split); -1 disables chunking"
    )
    max_prefill_tokens: int = _knob(
        8192, "prompt tokens per step when chunking is disabled (a single prompt may exceed it)"
    )
    attention_backend: str = _knob(
        "auto",
        "attention implementation: triton on CUDA, torch on CPU",
        ("auto", "torch", "triton"),
    )
    disable_radix_cache: bool = _knob(False, "turn off prefix reuse across requests")
    schedule_policy: str = _knob(
        "lpm",
        "waiting-queue order: longest prefix match (fcfs past 128 waiting), dfs-weight or fcfs",
        ("lpm", "dfs-weight", "fcfs"),
    )
    grammar_compile_timeout: float = _knob(
        10.0, "seconds a regex / JSON Schema / grammar may take to compile"
    )
    # Per-grammar budgets on what is built lazily while requests decode: a grammar past one
    # fails its own request (finish_reason abort naming the knob), never the batch.
    grammar_step_timeout: float = _knob(
        _GRAMMAR.step_timeout,
        "seconds of grammar work one call (a mask, an accept, forced text) may take",
    )
    grammar_max_states: int = _knob(
        _GRAMMAR.max_states, "states one grammar's lazy automata may build each"
    )
    grammar_max_state_size: int = _knob(
        _GRAMMAR.max_state_size,
        "NFA states in one DFA state (parser positions in one grammar state)",
    )
    grammar_max_earley_items: int = _knob(
        _GRAMMAR.max_earley_items, "items in one Earley set of a grammar"
    )
    grammar_max_chart_items: int = _knob(
        _GRAMMAR.max_chart_items, "items in all the Earley sets of one grammar (its chart)"
    )
    grammar_max_mb: float = _knob(_GRAMMAR.max_mb, "MiB one grammar may grow by after compiling")
    grammar_free_value_depth: int = _knob(
        _GRAMMAR.free_value_depth,
        "arrays/objects a JSON value that a JSON Schema leaves free may nest (`{}`, extra "
        "properties, items without a schema)",
    )
    grammar_json_key_order: str = _knob(
        _GRAMMAR.json_key_order,
        "order of a JSON object's members under a JSON Schema (radixflow backend): as "
        "`properties` declares them (as OpenAI and the peer backends generate), or any order",
        JSON_KEY_ORDERS,
    )
    grammar_cache_mb: float = _knob(
        DEFAULT_CACHE_MB,
        "MiB of compiled grammars kept by source; least recently used dropped first",
    )
    grammar_compile_workers: int = _knob(
        8, "threads compiling grammars at once (a cached grammar never waits for them)"
    )
    grammar_import_paths: str = _knob(
        "",
        "directories (separated by ':') whose .lark files request grammars may %import, besides "
        "the grammars bundled with lark; relative imports are always refused",
    )
    grammar_backend: str = _knob(
        "radixflow",
        'constrained-decoding engine: radixflow\'s own, or a peer (pip install "radixflow[NAME]")',
        ("radixflow", "llguidance", "xgrammar"),
    )
    grammar_backend_fallback: str | None = _knob(
        None,
        "backend that compiles the grammars grammar_backend refuses (an unsupported keyword, a "
        "limit, the compile timeout); logged once per grammar",
        ("radixflow", "llguidance", "xgrammar"),
    )
    jump_forward: bool = _knob(
        True, "append text a grammar forces in one extend step instead of decoding it"
    )
    incremental_streaming_output: bool = _knob(
        False,
        "/generate streams only the new text, output ids and output logprobs in each chunk "
        "(SGLang's --incremental-streaming-output); default: cumulative, as SGLang",
    )
    speculative_algorithm: str = _knob(
        "none",
        "speculative decoding: ngram proposes what followed the context's tail earlier in the "
        "prompt or output, draft runs speculative_draft_model; verified losslessly in one forward",
        ("none", "ngram", "draft"),
    )
    speculative_draft_model: str | None = _knob(
        None,
        "draft model for speculative_algorithm=draft (HF folder, .gguf or hub id); it must "
        "share the target's vocabulary",
    )
    speculative_num_tokens: int = _knob(
        4, "tokens proposed per request and step at most (adapted to each request's acceptance)"
    )
    speculative_max_batch: int = _knob(
        8, "speculate only while at most this many requests run (larger batches gain little)"
    )
    random_seed: int = _knob(0, "seed of the engine's shared sampling generator")
    gc_threshold: str | None = _knob(  # also a list of ints, as `rf.Engine` kwargs
        None,
        "Python's garbage-collector thresholds, 'gen0[,gen1[,gen2]]' (gc.set_threshold), set "
        "when the engine starts; a larger gen0 (e.g. 20000) collects less often while grammars "
        "compile and masks are built; default: Python's own (700,10,10)",
    )
    num_threads: int | None = _knob(
        None,
        "torch CPU threads (default: torch's choice; with tp_size > 1 each rank takes this "
        "node's cores / its ranks)",
    )
    tp_size: int = _knob(
        1,
        "tensor-parallel ranks: the model's heads and MLP split over this many processes "
        "(GPUs, or CPU processes over gloo); rank 0 schedules, every rank runs each step",
    )
    nnodes: int = _knob(1, "machines the tp_size ranks span (tp_size / nnodes ranks on each)")
    node_rank: int = _knob(
        0,
        "this machine's index among nnodes: 0 runs the engine (and server) with its ranks, "
        "the others run only worker ranks",
    )
    dist_init_addr: str | None = _knob(
        None,
        "host:port of node 0 where the ranks meet (needed with nnodes > 1; default: a free "
        "loopback port)",
    )
    dist_timeout: float = _knob(
        120.0,
        "seconds a tensor-parallel collective may wait before a missing rank counts as dead",
    )

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value is not None and value not in choices:
                raise ValueError(f"{f.name} must be one of {choices}, got {value!r}")
        self.gc_thresholds()  # raises on a malformed gc_threshold
        if self.page_size < 1:
            raise ValueError(f"page_size must be >= 1, got {self.page_size}")
        if self.max_running_requests < 1:
            raise ValueError(f"max_running_requests must be >= 1, got {self.max_running_requests}")
        if self.chunked_prefill_size == 0 or self.chunked_prefill_size < -1:
            raise ValueError(
                f"chunked_prefill_size must be positive or -1, got {self.chunked_prefill_size}"
            )
        if self.speculative_num_tokens < 1:
            raise ValueError(
                f"speculative_num_tokens must be >= 1, got {self.speculative_num_tokens}"
            )
        if self.speculative_algorithm == "draft" and not self.speculative_draft_model:
            raise ValueError('speculative_algorithm="draft" needs speculative_draft_model')
        if self.speculative_draft_model and self.speculative_algorithm != "draft":
            raise ValueError(
                "speculative_draft_model is set but speculative_algorithm is "
                f'{self.speculative_algorithm!r}, not "draft"'
            )
        if self.grammar_backend_fallback == self.grammar_backend:
            raise ValueError(
                f"grammar_backend_fallback must differ from grammar_backend "
                f"({self.grammar_backend!r})"
            )
        if self.speculative_max_batch < 1:
            raise ValueError(
                f"speculative_max_batch must be >= 1, got {self.speculative_max_batch}"
            )
        if self.max_total_tokens is not None and self.max_total_tokens < 2 * self.page_size:
            raise ValueError(f"max_total_tokens too small: {self.max_total_tokens}")
        if not 0.0 < self.mem_fraction_static <= 1.0:
            raise ValueError(
                f"mem_fraction_static must be in (0, 1], got {self.mem_fraction_static}"
            )
        self._check_parallel()

    def gc_thresholds(self) -> tuple[int, ...] | None:
        """`gc_threshold` as the ints `gc.set_threshold` takes, None when unset."""
        return None if self.gc_threshold is None else parse_gc_threshold(self.gc_threshold)

    def _check_parallel(self) -> None:
        if self.tp_size < 1 or self.nnodes < 1:
            raise ValueError(
                f"tp_size and nnodes must be >= 1, got tp_size={self.tp_size} nnodes={self.nnodes}"
            )
        if self.tp_size % self.nnodes:
            raise ValueError(
                f"tp_size {self.tp_size} does not split evenly over nnodes {self.nnodes}"
            )
        if not 0 <= self.node_rank < self.nnodes:
            raise ValueError(f"node_rank must be in [0, {self.nnodes - 1}], got {self.node_rank}")
        if self.nnodes > 1 and not self.dist_init_addr:
            raise ValueError("nnodes > 1 needs dist_init_addr (host:port of node 0)")
        if self.dist_init_addr is not None:
            host, _, port = self.dist_init_addr.rpartition(":")
            if not host or not port.isdigit():
                raise ValueError(f"dist_init_addr must be host:port, got {self.dist_init_addr!r}")
        if self.dist_timeout <= 0:
            raise ValueError(f"dist_timeout must be positive, got {self.dist_timeout}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        """The config from our knob names or SGLang's (`tp_size`, `dtype="half"`, ...);
        SGLang knobs this engine has no use for are logged and ignored, unknown ones raise."""
        names = {f.name for f in dataclasses.fields(cls)}
        ours: dict[str, Any] = {}
        for key, value in kwargs.items():
            if key in names:
                ours[key] = sglang_value(key, value)
            elif key in SGLANG_RENAMES:
                ours[SGLANG_RENAMES[key]] = sglang_value(SGLANG_RENAMES[key], value)
            elif key in SERVER_OPTIONS or key in SGLANG_IGNORED:
                check_sglang_option(key, value)
            else:
                hint = difflib.get_close_matches(key, names | set(SGLANG_RENAMES), n=1)
                extra = f"; did you mean {hint[0]!r}?" if hint else ""
                raise ValueError(f"unknown engine option {key!r}{extra}")
        return cls(**ours)


# -- SGLang's launch_server spellings -------------------------------------------------------
SGLANG_RENAMES = {
    "speculative_draft_model_path": "speculative_draft_model",
    "speculative_num_draft_tokens": "speculative_num_tokens",
}
# SGLang value -> ours, per knob; a value in neither set is checked by __post_init__
SGLANG_VALUES: dict[str, dict[str, Any]] = {
    "dtype": {"half": "float16", "float": "float32", "bf16": "bfloat16", "fp16": "float16"},
    "attention_backend": {"torch_native": "torch"},
    "speculative_algorithm": {"NGRAM": "ngram", "STANDALONE": "draft", "NONE": "none"},
    "schedule_policy": {"dfs_weight": "dfs-weight"},
}
# options of the server, not the engine (`radixflow serve` has them as flags)
SERVER_OPTIONS = {"host", "port", "api_key", "served_model_name", "log_level"}
# knob -> (the only value that exists here, why); any other value is an error naming the knob
SGLANG_SINGLE_VALUE: dict[str, tuple[Any, str]] = {
    "dp_size": (1, "replicas are `radixflow serve --dp-size N` (behind sglang-router)"),
    "pp_size": (1, "pipeline parallelism is not available here"),
    "kv_cache_dtype": ("auto", "the KV cache uses the model dtype"),
}
# knob -> (takes a value on the command line, why it is ignored)
SGLANG_IGNORED: dict[str, tuple[bool, str]] = {
    **{k: (True, why) for k, (_, why) in SGLANG_SINGLE_VALUE.items()},
    "enable_metrics": (False, "/metrics is always served"),
    "enable_cache_report": (False, "cached_tokens is always reported"),
    "trust_remote_code": (False, "no model code is ever loaded from the checkpoint"),
    "disable_cuda_graph": (False, "no CUDA graphs here"),
    "cuda_graph_max_bs": (True, "no CUDA graphs here"),
    "cuda_graph_bs": (True, "no CUDA graphs here"),
    "enable_torch_compile": (False, "no torch.compile here"),
    "torch_compile_max_bs": (True, "no torch.compile here"),
    "disable_overlap_schedule": (False, "the scheduler does not overlap steps"),
    "enable_mixed_chunk": (False, "prefill chunks and decodes already share steps"),
    "skip_server_warmup": (False, "the warm-up is one short generation"),
    "stream_interval": (True, "streams send every token"),
    "watchdog_timeout": (True, "no watchdog here"),
    "decode_log_interval": (True, "no periodic decode log"),
    "log_level_http": (True, "HTTP access logs follow --log-level"),
    "disable_custom_all_reduce": (False, "no all-reduce here"),
    "sampling_backend": (True, "one sampler (torch)"),
    "load_format": (True, "safetensors or GGUF, chosen by the files"),
}


def sglang_value(knob: str, value: Any) -> Any:
    return SGLANG_VALUES.get(knob, {}).get(value, value) if isinstance(value, str) else value


def check_sglang_option(knob: str, value: Any) -> None:
    """Raise for a single-value knob set to another value; log the rest as ignored."""
    if knob in SGLANG_SINGLE_VALUE:
        only, why = SGLANG_SINGLE_VALUE[knob]
        if value is not None and str(value) != str(only):
            raise ValueError(f"{knob}={value!r} is not supported: {why} (only {only!r})")
        return
    if knob in SERVER_OPTIONS:
        logger.info("%s=%r is a server option; ignored by the in-process engine", knob, value)
        return
    logger.warning("%s=%r ignored: %s", knob, value, SGLANG_IGNORED[knob][1])


def startup_summary(engine: Any) -> str:
    """One line: model, dtype, KV pool in tokens and GiB, attention kernels, grammar engine."""
    pool = engine.runner.pool
    gib = pool.capacity_tokens * pool.bytes_per_token() / 2**30
    return (
        f"model {engine.model_dir} | dtype {str(engine.runner.dtype).removeprefix('torch.')} | "
        f"device {engine.runner.device} | kernels {_kernels(engine)} | KV pool "
        f"{pool.capacity_tokens} tokens ({gib:.2f} GiB, set by {engine.runner.kv_plan.bound}) | "
        f"context {engine.context_length} | "
        f"attention {engine.runner.attention_backend} | grammar backend "
        f"{_grammar_backend(engine.config)} (fallback {engine.config.grammar_backend_fallback}) | "
        f"chat template {engine.config.chat_template or 'from the model'} | tool-call parser "
        f"{engine.config.tool_call_parser} | reasoning parser {engine.config.reasoning_parser}"
    )


def _grammar_backend(config: EngineConfig) -> str:
    """The grammar backend; ours with the trie walk its masks use and the code its automaton
    rows use (native or the Python twins)."""
    if config.grammar_backend != "radixflow":
        return config.grammar_backend
    from radixflow.grammars import native_rows, native_walk  # here: config imports no torch

    return f"radixflow, {native_walk.describe()}, {native_rows.describe()}"


def _kernels(engine: Any) -> str:
    """The implementation each of the model's ops was bound to at build (runtime/layers/), and
    on the CPU the C++ kernels' ISA or why they are off."""
    from radixflow.runtime.layers.target import OpsTarget  # here: config imports no torch

    target = OpsTarget(engine.runner.device, engine.runner.dtype)
    return f"{engine.runner.model.ops.describe()} ({target.describe()})"


def request_log_line(req: Any) -> str:
    """`--log-requests`: one finished request (rid, prompt tokens, params, finish)."""
    params = {
        k: v for k, v in dataclasses.asdict(req.params).items() if v not in (None, [], {}, "")
    }
    return (
        f"request {req.rid}: prompt_tokens={len(req.prompt_ids)} cached={req.cached_tokens} "
        f"completion_tokens={len(req.output_ids)} params={params} finish={req.finish_reason}"
    )
