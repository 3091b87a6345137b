"""A schema compile leaves no reference cycles behind: what it built is freed when the
compile ends, not by one of Python's full collections (a pause of milliseconds inside some
later compile or mask fill, and the memory held until then)."""

import collections
import gc

import pytest
from tiny_models import tiny_tokenizer

from radixflow.grammars import GrammarCompiler

PROPS = {"id": {"type": "string"}, "win": {"type": "integer"}, "lose": {"type": "integer"},
         "draw": {"type": "integer"}}
SCHEMAS = [
    # three branches that each meet both others: the fallback by cases raises before the one
    # by required names holds
    {"type": "object", "properties": PROPS,
     "oneOf": [{"required": ["id", "win"], "properties": {"win": {"minimum": 0}}},
               {"required": ["id", "lose"]}, {"required": ["id", "draw"]}]},
    # no fallback holds: the compile is refused
    {"oneOf": [{"minimum": 1}, {"maximum": 5}, {"multipleOf": 2}]},
    {"oneOf": [{"type": "array", "items": {"type": "integer"}},
               {"type": "array", "items": {"type": "string"}}]},
]  # fmt: skip


def cyclic_garbage(action) -> collections.Counter:
    """The types of the objects that only the cyclic collector would free after `action()`."""
    gc.collect()
    enabled = gc.isenabled()
    gc.disable()
    try:
        action()
        gc.set_debug(gc.DEBUG_SAVEALL)
        gc.collect()
        return collections.Counter(type(obj).__name__ for obj in gc.garbage)
    finally:
        gc.set_debug(0)
        gc.garbage.clear()
        if enabled:
            gc.enable()


def test_compiles_of_one_of_fallbacks_and_refusals_leave_no_cycles():
    compiler = GrammarCompiler(tiny_tokenizer(), compile_timeout=10.0)
    compiler.compile_json_schema({"type": "object"})  # first-use setup is not the compile's

    def compile_all():
        outcomes = []
        for schema in SCHEMAS:
            try:
                outcomes.append(compiler.compile_json_schema(schema) is not None)
            except ValueError as exc:
                outcomes.append(str(exc))
        assert outcomes[0] is True, outcomes
        assert all("may overlap" in str(o) for o in outcomes[1:]), outcomes

    assert cyclic_garbage(compile_all) == collections.Counter()


def test_the_probe_sees_a_cycle():
    """`cyclic_garbage` finds what it is for: an exception held by the frame it was raised in."""

    def cycle():
        def raise_held(exc):
            raise exc

        with pytest.raises(ValueError):
            raise_held(ValueError("held"))

    assert cyclic_garbage(cycle)["ValueError"] == 1
