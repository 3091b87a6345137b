"""The batched sampler against plain per-row references, HF's logits processors and OpenAI's
penalty definition; seeded determinism independent of the batch."""

import math

import pytest
import torch

import radixflow.runtime.sampler as sampler_module
from radixflow.runtime.request_sampler import RequestSampler
from radixflow.runtime.sampler import Sampler, SamplingBatch
from radixflow.runtime.sampling_params import SamplingParams

V = 32


def make(vocab_size: int = V, prompt=(), eos=(), **params) -> RequestSampler:
    p = SamplingParams(**params)
    p.validate(vocab_size)
    return RequestSampler(p, prompt_ids=list(prompt), eos_token_ids=eos)


def batch_of(samplers, vocab_size: int = V) -> SamplingBatch:
    return SamplingBatch.build(samplers, vocab_size, "cpu")


def random_logits(rows: int, vocab_size: int = V, seed: int = 0, scale: float = 3.0):
    return torch.randn(rows, vocab_size, generator=torch.Generator().manual_seed(seed)) * scale


def reference_probs(logits: list[float], p: SamplingParams) -> list[float]:
    """One row, one token at a time: temperature, then top-k, top-p, min-p, each renormalised."""
    if p.is_greedy:
        best = max(range(len(logits)), key=lambda i: logits[i])
        return [1.0 if i == best else 0.0 for i in range(len(logits))]
    peak = max(logits)
    weights = [math.exp((x - peak) / p.temperature) for x in logits]
    probs = [w / sum(weights) for w in weights]

    def renormalise(keep: set[int]) -> list[float]:
        total = sum(probs[i] for i in keep)
        return [probs[i] / total if i in keep else 0.0 for i in range(len(probs))]

    order = sorted(range(len(probs)), key=lambda i: -probs[i])
    if p.top_k != -1:
        probs = renormalise(set(order[: p.top_k]))
    if p.top_p < 1:
        keep, before = set(), 0.0
        for i in order:
            if before >= p.top_p:
                break
            keep.add(i)
            before += probs[i]
        probs = renormalise(keep)
    if p.min_p > 0:
        probs = renormalise({i for i in range(len(probs)) if probs[i] >= p.min_p * max(probs)})
    return probs


FILTER_CASES = [
    {},
    {"temperature": 0.0},
    {"top_k": 1},
    {"temperature": 0.5},
    {"temperature": 1.7},
    {"top_k": 5},
    {"top_k": 100},
    {"top_p": 0.6},
    {"top_p": 0.95, "temperature": 0.8},
    {"min_p": 0.1},
    {"min_p": 0.3, "temperature": 1.5},
    {"top_k": 8, "top_p": 0.7},
    {"top_k": 10, "min_p": 0.05},
    {"top_k": 12, "top_p": 0.8, "min_p": 0.02, "temperature": 0.9},
    {"top_p": 0.5, "min_p": 0.2},
]


def test_probs_match_the_per_row_reference_in_a_mixed_batch():
    samplers = [make(**case) for case in FILTER_CASES]
    logits = random_logits(len(samplers), seed=1)
    probs = Sampler(seed=0).probs(logits, batch_of(samplers))
    for row, s in enumerate(samplers):
        expected = torch.tensor(
            reference_probs(logits[row].tolist(), s.params), dtype=torch.float64
        )
        torch.testing.assert_close(probs[row].double(), expected, atol=1e-6, rtol=1e-5)


@pytest.mark.parametrize("case", FILTER_CASES)
def test_a_row_alone_gets_the_same_distribution_as_in_a_mixed_batch(case):
    samplers = [make(**c) for c in FILTER_CASES]
    logits = random_logits(len(samplers), seed=2)
    row = FILTER_CASES.index(case)
    together = Sampler(seed=0).probs(logits, batch_of(samplers))[row]
    alone = Sampler(seed=0).probs(logits[row : row + 1], batch_of([make(**case)]))[0]
    assert torch.equal(together, alone)


@pytest.mark.parametrize("candidates", [8, 64, 256, 600])
def test_top_p_over_a_partial_sort_equals_the_full_sort(monkeypatch, candidates):
    """Rows whose nucleus is wider than the candidate set fall back to a full sort."""
    vocab = 600
    cases = [
        {"top_p": 0.9},
        {"top_p": 0.3},
        {"top_k": 400, "top_p": 0.9},
        {"top_k": 100, "top_p": 0.5, "min_p": 0.001},
        {"top_k": 7},
        {},
    ]
    samplers = [make(vocab, **c) for c in cases] * 2
    logits = torch.cat([random_logits(6, vocab, seed=10, scale=0.2), random_logits(6, vocab, 11)])
    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", candidates)
    probs = Sampler(seed=0).probs(logits, batch_of(samplers, vocab))
    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", vocab)
    assert torch.equal(probs, Sampler(seed=0).probs(logits, batch_of(samplers, vocab)))
    for row, s in enumerate(samplers):
        expected = reference_probs(logits[row].tolist(), s.params)
        torch.testing.assert_close(
            probs[row].double(), torch.tensor(expected, dtype=torch.float64), atol=1e-6, rtol=1e-4
        )


@pytest.mark.parametrize("block", [4, 5, 256])
def test_inverse_cdf_matches_a_sequential_walk_and_skips_zero_weights(monkeypatch, block):
    monkeypatch.setattr(sampler_module, "SAMPLE_BLOCK", block)
    weights = torch.tensor(
        [
            [0.0, 0.3, 0.0, 1e-12, 0.2, 0.0, 0.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
            [0.0] * 13 + [1.0],
            [0.25, 0.25, 0.25, 0.25] + [0.0] * 10,
        ]
    )
    # away from the block edges, where float32 block masses may shift the boundary by ~1e-7
    for u in [0.0, 0.1, 0.45, 0.62, 0.75, 0.999, 1 - 2**-53]:
        got = sampler_module._inverse_cdf(weights, torch.full((3,), u, dtype=torch.float64))
        for row in range(3):
            w = weights[row].double().tolist()
            x, total, expected = u * sum(w), 0.0, None
            for j, wj in enumerate(w):
                total += wj
                if wj > 0:
                    expected = j  # the last positive weight when x reaches the total
                    if total > x:
                        break
            assert got[row].item() == expected, (u, row)


def test_greedy_rows_take_the_argmax():
    samplers = [make(temperature=0.0), make(top_k=1, temperature=2.0), make(temperature=0.0)] * 3
    logits = random_logits(len(samplers), seed=3)
    out = Sampler(seed=0).sample(logits, batch_of(samplers))
    assert torch.equal(out.next_token_ids, logits.argmax(dim=-1))


def wilson_hilferty_critical(df: int, z: float = 4.26) -> float:
    """Chi-square quantile for a one-sided p of about 1e-5."""
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


@pytest.mark.parametrize(
    "case",
    [{}, {"temperature": 0.6}, {"top_k": 4}, {"top_p": 0.7}, {"min_p": 0.15, "top_k": 6}],
)
@pytest.mark.parametrize("seeded", [False, True])
def test_sampled_frequencies_follow_the_reference_distribution(monkeypatch, case, seeded):
    monkeypatch.setattr(sampler_module, "SAMPLE_BLOCK", 3)  # two full blocks and a tail
    vocab, draws = 8, 10_000
    row_logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -3.0, 1.5, 0.7])
    samplers = [make(vocab, seed=i if seeded else None, **case) for i in range(draws)]
    out = Sampler(seed=123).sample(row_logits.expand(draws, vocab), batch_of(samplers, vocab))
    observed = torch.bincount(out.next_token_ids, minlength=vocab).double()
    expected = torch.tensor(reference_probs(row_logits.tolist(), samplers[0].params)) * draws
    support = expected > 0
    assert observed[~support].sum() == 0, "a filtered-out token was sampled"
    chi2 = (((observed - expected)[support]) ** 2 / expected[support]).sum().item()
    assert chi2 < wilson_hilferty_critical(int(support.sum()) - 1)


def test_repetition_penalty_matches_hf_processor():
    from transformers import RepetitionPenaltyLogitsProcessor

    prompt, generated = [3, 5, 5, 9], [12, 3, 20]
    s = make(prompt=prompt, repetition_penalty=1.6)
    for t in generated:
        s.observe(t)
    logits = random_logits(1, seed=4)
    ours = Sampler(seed=0).adjust_logits(logits, batch_of([s]))
    hf = RepetitionPenaltyLogitsProcessor(1.6)(torch.tensor([prompt + generated]), logits.clone())
    torch.testing.assert_close(ours, hf)


def test_frequency_and_presence_penalties_follow_openai_definition():
    generated = [1, 1, 1, 7, 30, 7]
    s = make(prompt=[2, 2, 4], frequency_penalty=0.4, presence_penalty=-0.9)
    for t in generated:
        s.observe(t)
    logits = random_logits(1, seed=5)
    ours = Sampler(seed=0).adjust_logits(logits, batch_of([s]))[0]
    counts = [generated.count(j) for j in range(V)]  # generated tokens only, not the prompt
    expected = [
        logits[0, j].item() - 0.4 * counts[j] - (0.9 * -1) * (counts[j] > 0) for j in range(V)
    ]
    torch.testing.assert_close(ours, torch.tensor(expected))


def test_penalties_per_row_in_a_mixed_batch_match_the_references():
    from transformers import RepetitionPenaltyLogitsProcessor

    prompt, generated = [0, 1, 2], [2, 2, 6]
    samplers = [
        make(prompt=prompt, repetition_penalty=0.7),
        make(prompt=prompt),
        make(prompt=prompt, frequency_penalty=1.0, repetition_penalty=1.3, logit_bias={6: 2.0}),
    ]
    for s in samplers:
        for t in generated:
            s.observe(t)
    logits = random_logits(3, seed=6)
    ours = Sampler(seed=0).adjust_logits(logits, batch_of(samplers))
    ids = torch.tensor([prompt + generated])
    torch.testing.assert_close(ours[0:1], RepetitionPenaltyLogitsProcessor(0.7)(ids, logits[0:1]))
    torch.testing.assert_close(ours[1], logits[1])
    # bias first, then repetition, then frequency (count 2 for token 2, 1 for token 6)
    biased = logits[2:3].clone()
    biased[0, 6] += 2.0
    expected = RepetitionPenaltyLogitsProcessor(1.3)(ids, biased)[0]
    expected[2] -= 2.0
    expected[6] -= 1.0
    torch.testing.assert_close(ours[2], expected)


def test_logit_bias_steers_sampling_and_leaves_input_untouched():
    logits = torch.zeros(2, V)
    before = logits.clone()
    samplers = [make(logit_bias={17: 100.0}), make(temperature=0.0, logit_bias={4: 1.0})]
    out = Sampler(seed=0).sample(logits, batch_of(samplers))
    assert out.next_token_ids.tolist() == [17, 4]
    assert torch.equal(logits, before)


def test_min_new_tokens_blocks_eos_and_stop_ids_until_reached():
    eos, stop = 0, 5
    s = make(eos=[eos], min_new_tokens=3, stop_token_ids=[stop], temperature=0.0)
    free = make(eos=[eos], temperature=0.0)
    logits = torch.zeros(2, V)
    logits[:, eos] = 10.0
    logits[:, stop] = 9.0
    sampler, tokens = Sampler(seed=0), []
    for _ in range(5):
        out = sampler.sample(logits, batch_of([s, free]))
        assert out.next_token_ids[1] == eos  # no min_new_tokens: EOS wins
        tokens.append(int(out.next_token_ids[0]))
        s.observe(tokens[-1])
    assert all(t not in (eos, stop) for t in tokens[:3])
    assert tokens[3:] == [eos, eos]
    probs = sampler.probs(logits[:1], batch_of([make(eos=[eos], min_new_tokens=1)]))
    assert probs[0, eos] == 0 and probs[0].sum().item() == pytest.approx(1.0)


def run_steps(samplers, steps: int, row_seeds: list[int], engine_seed: int) -> list[list[int]]:
    """Sample `steps` tokens for each request; each request's logits depend on (its id, step)."""
    sampler, tokens = Sampler(seed=engine_seed), [[] for _ in samplers]
    for step in range(steps):
        logits = torch.cat(
            [random_logits(1, LARGE_V, seed=r * 1000 + step, scale=1.5) for r in row_seeds]
        )
        out = sampler.sample(logits, batch_of(samplers, LARGE_V))
        for i, (s, t) in enumerate(zip(samplers, out.next_token_ids.tolist(), strict=True)):
            s.observe(t)
            tokens[i].append(t)
    return tokens


LARGE_V = 600  # several sampling blocks and top-p candidate sets, plus a tail


def test_seeded_request_is_reproducible_whatever_its_neighbours(monkeypatch):
    monkeypatch.setattr(sampler_module, "SAMPLE_BLOCK", 64)
    monkeypatch.setattr(sampler_module, "TOP_P_CANDIDATES", 16)
    subjects = [
        {"seed": 1234, "temperature": 0.9, "top_p": 0.95},  # nucleus wider than 16 candidates
        {"seed": 77, "top_k": 300, "top_p": 0.9, "min_p": 0.001},
        {"seed": 99},
    ]
    alone = run_steps([make(LARGE_V, **c) for c in subjects], 40, [7, 8, 9], engine_seed=0)
    crowded = run_steps(
        [
            make(LARGE_V),  # unseeded: draws from the engine generator
            make(LARGE_V, **subjects[2]),
            make(LARGE_V, temperature=0.0),
            make(LARGE_V, top_k=500, top_p=0.3),  # 500 candidates for the whole batch
            make(LARGE_V, **subjects[0]),
            make(LARGE_V, seed=5, frequency_penalty=0.5, repetition_penalty=1.2, prompt=[1, 2]),
            make(LARGE_V, **subjects[1]),
            make(LARGE_V, top_k=50, logit_bias={3: 5.0}, min_new_tokens=2, eos=[0]),
        ],
        40,
        [1, 9, 2, 3, 7, 4, 8, 5],
        engine_seed=42,
    )
    assert [crowded[4], crowded[6], crowded[1]] == alone
    assert all(len(set(tokens)) > 10 for tokens in alone)  # really sampled
    other_seed = run_steps([make(LARGE_V, **{**subjects[0], "seed": 4321})], 40, [7], 0)
    assert other_seed[0] != alone[0]


def test_logprobs_are_log_softmax_of_the_raw_logits():
    samplers = [
        make(temperature=0.5, repetition_penalty=1.5, prompt=[1]),
        make(temperature=0.0, logit_bias={2: 3.0}),
        make(top_k=3),
    ]
    logits = random_logits(3, seed=9)
    out = Sampler(seed=0).sample(
        logits, batch_of(samplers), return_logprob=True, top_logprobs_num=5
    )
    reference = torch.log_softmax(logits, dim=-1)
    chosen = reference.gather(1, out.next_token_ids.unsqueeze(1)).squeeze(1)
    torch.testing.assert_close(out.logprobs, chosen)
    values, ids = out.top_logprobs
    expected_values, expected_ids = torch.topk(reference, 5, dim=-1)
    torch.testing.assert_close(values, expected_values)
    assert torch.equal(ids, expected_ids)
    assert torch.all(values[:, :-1] >= values[:, 1:])
    plain = Sampler(seed=0).sample(logits, batch_of(samplers))
    assert plain.logprobs is None and plain.top_logprobs is None


def test_token_counts_are_kept_only_for_penalties():
    assert make().output_tokens is None and make().seen_tokens is None
    s = make(prompt=[4, 4, 9], presence_penalty=0.1, repetition_penalty=1.1)
    for t in [9, 3] + list(range(20, 32)) * 2:  # more distinct tokens than the first buffer
        s.observe(t)
    assert dict(
        zip(s.output_tokens.ids.tolist(), s.output_tokens.counts.tolist(), strict=True)
    ) == {9: 1, 3: 1, **{t: 2 for t in range(20, 32)}}
    assert sorted(s.seen_tokens.ids.tolist()) == [3, 4, 9, *range(20, 32)]


def test_logits_of_the_wrong_shape_are_rejected():
    with pytest.raises(ValueError, match="shape"):
        Sampler(seed=0).sample(torch.zeros(2, V), batch_of([make()]))
