"""An engine that stops (shut down, or failed as when a tensor-parallel rank dies) answers every
request it took and refuses the rest: a caller is never left waiting, not even one that passed
the liveness check just as the engine's loop ended."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable
from typing import Any

import pytest
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.runtime.engine_inbox import Flush, Inbox, Unpin

KNOBS = {"dtype": "float32", "max_total_tokens": 512, "num_threads": 1}
LONG = {"temperature": 0, "max_new_tokens": 200, "ignore_eos": True}
CALL_BOUND_S = 30.0


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    return make_tiny_model_dir(tmp_path_factory.mktemp("lifecycle"), "llama", seed=2)


def _outcome(call: Callable[[], Any]) -> Any:
    """What `call` returned or raised, from a thread: a call still blocked after the bound
    fails the test instead of hanging it."""
    box: list[Any] = []

    def run() -> None:
        try:
            box.append(call())
        except Exception as exc:  # the outcome under test
            box.append(exc)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    thread.join(CALL_BOUND_S)
    assert box, f"the call was still waiting after {CALL_BOUND_S} s"
    return box[0]


def _past_the_liveness_check(engine: rf.Engine) -> None:
    """Calls from now on reach the inbox as one racing the loop's end would."""
    engine._check_alive = lambda: None  # type: ignore[method-assign]


def test_a_failed_engine_aborts_its_requests_and_refuses_late_ones(model_dir):
    engine = rf.Engine(str(model_dir), **KNOBS)
    try:
        stream = engine.generate(input_ids=[5, 6, 7], sampling_params=LONG, stream=True)
        next(stream)
        engine._fail("a rank died")  # what the tensor-parallel watch thread calls
        last = _outcome(lambda: list(stream)[-1])
        reason = last["meta_info"]["finish_reason"]
        assert (reason["type"], reason["message"]) == ("abort", "engine failed: a rank died")
        assert last["meta_info"]["completion_tokens"] < LONG["max_new_tokens"]
        engine._thread.join(CALL_BOUND_S)
        assert not engine._thread.is_alive()

        _past_the_liveness_check(engine)
        late = _outcome(lambda: engine.generate(input_ids=[9, 8], sampling_params=LONG))
        assert isinstance(late, RuntimeError) and "engine failed: a rank died" in str(late)
        flush = _outcome(engine.flush_cache)
        assert isinstance(flush, RuntimeError) and "engine failed" in str(flush)
    finally:
        engine.shutdown()


def test_a_shut_down_engine_refuses_what_races_its_end(model_dir):
    engine = rf.Engine(str(model_dir), **KNOBS)
    pin = engine.pin_prefix(input_ids=[4, 5, 6, 7])
    engine.shutdown()
    _past_the_liveness_check(engine)

    late = _outcome(lambda: engine.generate(input_ids=[9, 8], sampling_params=LONG))
    assert isinstance(late, RuntimeError) and "shut down" in str(late)
    late_async = _outcome(
        lambda: asyncio.run(engine.async_generate(input_ids=[9, 8], sampling_params=LONG))
    )
    assert isinstance(late_async, RuntimeError) and "shut down" in str(late_async)
    assert _outcome(lambda: engine.abort("no-such-request")) is None
    engine._stopped = False  # unpin's own early return skipped: the inbox answers it
    assert _outcome(lambda: engine.unpin_prefix(pin)) is None


def test_a_sealed_inbox_refuses_submissions_but_keeps_what_came_before(model_dir):
    inbox = Inbox()
    engine = rf.Engine(str(model_dir), **KNOBS)
    try:
        early, late = (
            engine._requests.reqs(engine.make_input(input_ids=[i, 3]))[0] for i in (5, 6)
        )
    finally:
        engine.shutdown()
    inbox.submit([early], None)
    inbox.abort(early.rid)
    inbox.seal("the engine has been shut down")
    with pytest.raises(RuntimeError, match="the engine has been shut down"):
        inbox.submit([late], None)
    inbox.abort(late.rid)  # nothing left to stop: not queued
    error = inbox.ask(Flush())
    assert isinstance(error, RuntimeError) and "shut down" in str(error)
    assert inbox.ask(Unpin("pin")) is None
    drained = list(inbox.drain())
    assert [type(m).__name__ for m in drained] == ["Submission", "str"]
    assert drained[0].req is early and drained[1] == early.rid
