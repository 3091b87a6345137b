"""A constrained request prefills its prompt while its grammar compiles (tiny random model).

The compile is held back by the test (the grammar service's `submit` hands out a future the test
completes), so what the engine does meanwhile is observable: the prompt's KV is written, whole,
the logits of the first token wait, and no token is sampled before the grammar is there; then
it is sampled from those logits without another forward. A failed compile is the caller's
error, as before, and frees the request's rid at once.
"""

from __future__ import annotations

import re
import threading
import time
from concurrent.futures import Future

import pytest
from kv_checks import assert_kv_released
from tiny_models import make_tiny_model_dir

import radixflow as rf

REGEX = r"(yes|no)-[0-9]{2}"


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    path = make_tiny_model_dir(tmp_path_factory.mktemp("overlap"), "llama", seed=3)
    eng = rf.Engine(str(path), dtype="float32", chunked_prefill_size=16)
    yield eng
    eng.shutdown()


class HeldCompiles:
    """Wraps `engine.grammars.submit`: each compile runs, but its future is completed only when
    the test releases it."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.submit = engine.grammars.submit
        self.held: list[tuple[Future, Future]] = []
        self.release = threading.Event()

    def __enter__(self) -> HeldCompiles:
        def submit(params):
            real, held = self.submit(params), Future()
            self.held.append((real, held))

            def forward() -> None:
                self.release.wait()
                if real.exception() is not None:
                    held.set_exception(real.exception())
                else:
                    held.set_result(real.result())

            threading.Thread(target=forward, daemon=True).start()
            return held

        self.engine.grammars.submit = submit
        return self

    def __exit__(self, *exc) -> None:
        self.release.set()
        self.engine.grammars.submit = self.submit


def _wait_for(predicate, timeout: float = 60.0) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < end, "timed out"
        time.sleep(0.01)


def test_the_prompt_prefills_while_the_grammar_compiles(engine):
    prompt = list(range(5, 45))  # 40 tokens: three chunks of the 16-token prefill budget
    params = {"max_new_tokens": 12, "temperature": 0, "regex": REGEX}
    result: dict = {}
    steps = engine.stats["steps"]
    with HeldCompiles(engine) as compiles:
        worker = threading.Thread(
            target=lambda: result.update(
                out=engine.generate(input_ids=prompt, sampling_params=params)
            )
        )
        worker.start()
        _wait_for(lambda: engine.scheduler.running and engine.scheduler.running[0].kv.length > 0)
        req = engine.scheduler.running[0]
        _wait_for(lambda: req.deferred_logits is not None)
        assert req.kv.length == len(prompt)
        time.sleep(0.2)  # the engine keeps waiting: nothing is fed or sampled without the grammar
        assert req.kv.length == len(prompt)
        assert req.output_ids == [] and req.grammar is None
        compiles.release.set()
        worker.join(timeout=120)
    held_steps = engine.stats["steps"] - steps
    out = result["out"]
    assert re.fullmatch(REGEX, out["text"]), out["text"]
    assert out["meta_info"]["finish_reason"]["type"] == "stop"
    assert_kv_released(engine)

    # With its grammar compiled beforehand the same request samples its first token in its
    # last prefill step: the same tokens, and as many forwards (the deferred sample took none).
    engine.flush_cache()  # the prefix cache, and the grammar cache too
    engine.grammars.compiler.compile("regex", REGEX)
    steps = engine.stats["steps"]
    again = engine.generate(input_ids=prompt, sampling_params=params)
    assert again["output_ids"] == out["output_ids"]
    assert engine.stats["steps"] - steps == held_steps


def test_a_failed_compile_is_the_callers_error_and_frees_the_rid(engine):
    params = {"max_new_tokens": 4, "json_schema": '{"type": "object", "unknownKeyword": ['}
    for _ in range(2):  # the same rid again: the first request is gone when the error arrives
        with pytest.raises(ValueError):
            engine.generate("hello there", params, rid="overlap-rid")
    out = engine.generate("hello there", {"max_new_tokens": 2}, rid="overlap-rid")
    assert out["meta_info"]["completion_tokens"] == 2
    assert_kv_released(engine)
