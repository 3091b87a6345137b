"""SamplingParams: SGLang defaults, parsing from request JSON, and validation errors."""

import re

import pytest

from radixflow.runtime.sampling_params import SamplingParams


def test_defaults_follow_sglang():
    p = SamplingParams()
    assert (p.max_new_tokens, p.min_new_tokens, p.stop, p.stop_token_ids) == (128, 0, None, None)
    assert (p.temperature, p.top_p, p.top_k, p.min_p) == (1.0, 1.0, -1, 0.0)
    assert (p.frequency_penalty, p.presence_penalty, p.repetition_penalty) == (0.0, 0.0, 1.0)
    assert (p.ignore_eos, p.n, p.seed, p.logit_bias) == (False, 1, None, None)
    assert (p.regex, p.json_schema, p.ebnf, p.lark) == (None, None, None, None)
    assert (p.skip_special_tokens, p.spaces_between_special_tokens, p.no_stop_trim) == (
        True,
        True,
        False,
    )
    p.validate(vocab_size=100)
    assert SamplingParams.from_dict(None) == p
    assert SamplingParams.from_dict({}) == p


def test_from_dict_reads_values_and_coerces_json_forms():
    p = SamplingParams.from_dict(
        {
            "max_new_tokens": 7,
            "temperature": 0,
            "stop": ["\n"],
            "stop_token_ids": (3, 4),
            "logit_bias": {"5": -100, "6": 2.5},
            "json_schema": {"type": "object"},
        }
    )
    assert p.max_new_tokens == 7
    assert p.temperature == 0.0 and isinstance(p.temperature, float)
    assert p.stop_token_ids == [3, 4]
    assert p.logit_bias == {5: -100, 6: 2.5}
    assert p.grammar == ("json_schema", {"type": "object"})


def test_unknown_key_suggests_the_closest_name():
    with pytest.raises(
        ValueError, match="unknown sampling parameter 'max_token'; did you mean 'max_new_tokens'"
    ):
        SamplingParams.from_dict({"max_token": 5})
    with pytest.raises(ValueError, match="unknown sampling parameter 'zzz'$"):
        SamplingParams.from_dict({"zzz": 1})


def test_null_means_the_default_as_in_sglang():
    p = SamplingParams.from_dict(
        {"min_new_tokens": None, "top_p": None, "no_stop_trim": None, "temperature": None}
    )
    assert p == SamplingParams()
    for field in ("min_new_tokens", "top_p", "repetition_penalty", "no_stop_trim"):
        with pytest.raises(ValueError, match=f"'{field}'"):
            SamplingParams(**{field: None}).validate()


def test_sampling_seed_is_sglangs_name_for_seed():
    assert SamplingParams.from_dict({"sampling_seed": 5}).seed == 5
    assert SamplingParams.from_dict({"sampling_seed": 5, "seed": 5}).seed == 5
    with pytest.raises(ValueError, match="'sampling_seed' and 'seed' disagree"):
        SamplingParams.from_dict({"sampling_seed": 5, "seed": 6})


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ("(", "valid regular expression"),
        (["ok", "[a-"], "valid regular expression"),
        ("a?", "empty string"),
        ([""], "non-empty strings"),
        (5, "a string or a list of strings"),
    ],
)
def test_stop_regex_is_checked(value, words):
    with pytest.raises(ValueError, match=f"'stop_regex' .*{re.escape(words)}"):
        SamplingParams.from_dict({"stop_regex": value}).validate()
    p = SamplingParams.from_dict({"stop_regex": ["\\d+\\.", "END"]})
    p.validate()
    assert p.stop_regex_patterns == ["\\d+\\.", "END"]


@pytest.mark.parametrize(
    ("field", "value"),
    [("structural_tag", "{}"), ("custom_params", {"a": 1}), ("beam_width", 2), ("watermark", {})],
)
def test_sglang_params_not_implemented_are_named(field, value):
    with pytest.raises(ValueError, match=f"'{field}' is not supported"):
        SamplingParams.from_dict({field: value})
    assert SamplingParams.from_dict({field: None}) == SamplingParams()


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("max_new_tokens", 1.5),
        ("max_new_tokens", "10"),
        ("top_k", True),
        ("n", 2.0),
        ("temperature", "hot"),
        ("min_p", [0.1]),
        ("frequency_penalty", False),
        ("presence_penalty", "0"),
        ("ignore_eos", 1),
        ("skip_special_tokens", "yes"),
        ("spaces_between_special_tokens", 0),
        ("seed", 1.0),
        ("seed", "42"),
        ("regex", 5),
        ("ebnf", ["a"]),
        ("lark", {"a": 1}),
        ("json_schema", 3),
        ("stop", 5),
        ("stop_token_ids", [1, "2"]),
        ("stop_token_ids", 2),
        ("logit_bias", {"x": 1.0}),
        ("logit_bias", {1: "big"}),
        ("logit_bias", [1, 2]),
    ],
)
def test_wrong_type_names_the_field(field, value):
    with pytest.raises(ValueError, match=f"'{field}'"):
        SamplingParams.from_dict({field: value})
    with pytest.raises(ValueError, match=f"'{field}'"):
        SamplingParams(**{field: value}).validate()


@pytest.mark.parametrize(
    ("field", "changes"),
    [
        ("max_new_tokens", {"max_new_tokens": -1}),
        ("min_new_tokens", {"min_new_tokens": -1}),
        ("min_new_tokens", {"min_new_tokens": 11, "max_new_tokens": 10}),
        ("temperature", {"temperature": -0.1}),
        ("temperature", {"temperature": float("inf")}),
        ("temperature", {"temperature": float("nan")}),
        ("top_p", {"top_p": 0.0}),
        ("top_p", {"top_p": 1.01}),
        ("top_p", {"top_p": float("nan")}),
        ("top_k", {"top_k": 0}),
        ("top_k", {"top_k": -2}),
        ("min_p", {"min_p": -0.01}),
        ("min_p", {"min_p": 1.5}),
        ("frequency_penalty", {"frequency_penalty": 2.5}),
        ("frequency_penalty", {"frequency_penalty": -2.01}),
        ("presence_penalty", {"presence_penalty": -3}),
        ("repetition_penalty", {"repetition_penalty": 0}),
        ("repetition_penalty", {"repetition_penalty": 2.1}),
        ("n", {"n": 0}),
        ("n", {"n": 129}),
        ("seed", {"seed": -1}),
        ("seed", {"seed": 2**64}),
        ("stop", {"stop": ""}),
        ("stop", {"stop": ["ok", ""]}),
        ("stop", {"stop": ["ok", 3]}),
        ("stop_token_ids", {"stop_token_ids": [-1]}),
        ("stop_token_ids", {"stop_token_ids": [1, 100]}),
        ("logit_bias", {"logit_bias": {100: 1.0}}),
        ("logit_bias", {"logit_bias": {-1: 1.0}}),
        ("logit_bias", {"logit_bias": {3: 101.0}}),
        ("logit_bias", {"logit_bias": {3: float("nan")}}),
    ],
)
def test_out_of_range_names_the_field(field, changes):
    with pytest.raises(ValueError, match=f"'{field}'"):
        SamplingParams(**changes).validate(vocab_size=100)


def test_token_ids_are_checked_against_the_vocabulary_only_when_known():
    SamplingParams(stop_token_ids=[500], logit_bias={500: 1.0}).validate()
    with pytest.raises(ValueError, match="'stop_token_ids'"):
        SamplingParams(stop_token_ids=[500]).validate(vocab_size=500)


@pytest.mark.parametrize(
    "grammars",
    [
        {"regex": "a+", "json_schema": "{}"},
        {"ebnf": "root ::= 'a'", "lark": "start: 'a'"},
        {"regex": "a", "lark": "start: 'a'"},
        {"json_schema": {"type": "string"}, "ebnf": "root ::= 'a'"},
    ],
)
def test_more_than_one_grammar_is_rejected_naming_them(grammars):
    with pytest.raises(ValueError, match="mutually exclusive") as info:
        SamplingParams(**grammars).validate()
    for name in grammars:
        assert f"'{name}'" in str(info.value)


def test_edge_values_are_valid():
    SamplingParams(
        max_new_tokens=0,
        temperature=0.0,
        top_p=1.0,
        top_k=1,
        min_p=1.0,
        frequency_penalty=-2.0,
        presence_penalty=2.0,
        repetition_penalty=2.0,
        n=128,
        seed=0,
        stop="x",
        stop_token_ids=[0, 99],
        logit_bias={0: -100.0, 99: 100.0},
        lark="start: 'a'",
    ).validate(vocab_size=100)


def test_derived_properties():
    assert SamplingParams(temperature=0.0).is_greedy
    assert SamplingParams(top_k=1).is_greedy
    assert not SamplingParams(temperature=0.5, top_k=2).is_greedy
    assert SamplingParams().stop_strings == []
    assert SamplingParams(stop="end").stop_strings == ["end"]
    assert SamplingParams(stop=["a", "b"]).stop_strings == ["a", "b"]
    assert SamplingParams().grammar is None
    assert SamplingParams(regex="[0-9]+").grammar == ("regex", "[0-9]+")
    assert SamplingParams(ebnf="root ::= 'x'").grammar == ("ebnf", "root ::= 'x'")
    assert not SamplingParams().needs_penalties
    assert SamplingParams(presence_penalty=0.5).needs_penalties


def test_expand_gives_n_independent_single_copies_with_offset_seeds():
    p = SamplingParams(n=3, seed=10, stop=["x"], temperature=0.7)
    copies = p.expand()
    assert [c.seed for c in copies] == [10, 11, 12]
    assert all(c.n == 1 and c.temperature == 0.7 for c in copies)
    copies[0].stop.append("y")
    assert p.stop == ["x"] and copies[1].stop == ["x"]
    assert [c.seed for c in SamplingParams(n=2).expand()] == [None, None]
