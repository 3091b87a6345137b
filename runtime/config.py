"""Every engine knob, with its default and help text, in one place (the CLI is generated from it)."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import dataclass, field
from typing import Any

from radixflow.grammars import GrammarLimits
from radixflow.grammars.compiler import DEFAULT_CACHE_MB

_GRAMMAR = GrammarLimits()  # the grammar_<limit> knobs' defaults


def _knob(default: Any, help: str, choices: tuple[str, ...] | None = None) -> Any:
    return field(default=default, metadata={"help": help, "choices": choices})


@dataclass
class EngineConfig:
    model_path: str | None = _knob(
        None, "HF folder, .gguf file or hub id (from the HF cache); default: SmolLM2-135M-Instruct"
    )
    dtype: str = _knob(
        "auto", "weight and activation dtype", ("auto", "float32", "bfloat16", "float16")
    )
    device: str = _knob("auto", "torch device: auto picks cuda when available, else cpu")
    page_size: int = _knob(1, "tokens per KV page")
    max_total_tokens: int | None = _knob(
        None, "KV pool size in tokens (default: from kv_cache_gb on CPU, free memory on GPU)"
    )
    kv_cache_gb: float = _knob(2.0, "KV pool size in GiB on the CPU when max_total_tokens is unset")
    mem_fraction_static: float = _knob(0.85, "fraction of free GPU memory for weights + KV pool")
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
    jump_forward: bool = _knob(
        True, "append text a grammar forces in one extend step instead of decoding it"
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
    num_threads: int | None = _knob(None, "torch CPU threads (default: torch's choice)")

    def __post_init__(self) -> None:
        for f in dataclasses.fields(self):
            choices = f.metadata.get("choices")
            value = getattr(self, f.name)
            if choices and value not in choices:
                raise ValueError(f"{f.name} must be one of {choices}, got {value!r}")
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
        if self.speculative_max_batch < 1:
            raise ValueError(
                f"speculative_max_batch must be >= 1, got {self.speculative_max_batch}"
            )
        if self.max_total_tokens is not None and self.max_total_tokens < 2 * self.page_size:
            raise ValueError(f"max_total_tokens too small: {self.max_total_tokens}")

    @classmethod
    def from_kwargs(cls, **kwargs: Any) -> EngineConfig:
        names = {f.name for f in dataclasses.fields(cls)}
        for key in kwargs:
            if key not in names:
                hint = difflib.get_close_matches(key, names, n=1)
                extra = f"; did you mean {hint[0]!r}?" if hint else ""
                raise ValueError(f"unknown engine option {key!r}{extra}")
        return cls(**kwargs)
