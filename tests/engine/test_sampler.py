from dataclasses import dataclass, field

import pytest
import torch

from swarmfactory.engine import SamplingParams
from swarmfactory.engine.sampler import TOP_P_FIRST, _penalise, sample


@dataclass
class Row:
    """What the sampler reads of a sequence."""

    params: SamplingParams
    prompt_ids: list = field(default_factory=lambda: [0])
    output_ids: list = field(default_factory=list)
    generator: torch.Generator | None = None
    grammar: object = None

    def __post_init__(self):
        if self.params.seed is not None and self.generator is None:
            self.generator = torch.Generator().manual_seed(self.params.seed)


def tokens(logits, rows):
    return sample(logits, rows)[0]


def test_greedy_is_argmax_with_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    assert tokens(logits, [Row(SamplingParams()), Row(SamplingParams())]) == [1, 0]


def test_seeded_sampling_repeats_alone_and_batched_and_varies_with_seed():
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(0))

    def draws(seed, batched):
        row = Row(SamplingParams(temperature=1.0, seed=seed))
        out = []
        for _ in range(20):
            if batched:  # beside an unseeded row and a greedy one, in the middle
                out.append(tokens(logits, [Row(SamplingParams(temperature=0.8)), row, Row(SamplingParams())])[1])
            else:
                out.append(tokens(logits[1:2], [row])[0])
        return out

    assert draws(1, False) == draws(1, False) == draws(1, True)
    assert draws(1, False) != draws(2, False)


def test_draws_follow_the_tempered_distribution():
    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0]])
    p = SamplingParams(temperature=0.7, seed=3)
    row = Row(p)
    n = 4000
    counts = torch.bincount(torch.tensor([tokens(logits, [row])[0] for _ in range(n)]), minlength=4).double()
    expect = torch.softmax(logits[0].double() / 0.7, -1) * n
    chi2 = float(((counts - expect) ** 2 / expect).sum())
    assert chi2 < 16.3, (counts, expect)  # 3 degrees of freedom, p = 0.001


def test_top_p_top_k_and_min_p_keep_only_their_tokens():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    g = dict(temperature=1.0, seed=0)
    assert {tokens(logits, [r])[0] for r in [Row(SamplingParams(top_p=0.7, **g))] for _ in range(300)} == {0, 1}
    assert {tokens(logits, [r])[0] for r in [Row(SamplingParams(top_k=1, **g))] for _ in range(100)} == {0}
    assert {tokens(logits, [r])[0] for r in [Row(SamplingParams(top_k=3, **g))] for _ in range(400)} == {0, 1, 2}
    # min_p 0.5: tokens with at least half the best one's probability (0.25): 0 and 1
    assert {tokens(logits, [r])[0] for r in [Row(SamplingParams(min_p=0.5, **g))] for _ in range(300)} == {0, 1}


def test_top_p_past_the_first_tokens_sorts_the_whole_row():
    V = 5000  # a long flat tail: the best TOP_P_FIRST tokens hold far less than top_p
    logits = -torch.arange(V, dtype=torch.float32)[None, :] * 1e-4
    probs = torch.softmax(logits[0].double(), -1)
    nucleus = int(((probs.cumsum(0) - probs) < 0.9).sum())
    assert nucleus > 2 * TOP_P_FIRST
    row = Row(SamplingParams(temperature=1.0, top_p=0.9, seed=5))
    got = [tokens(logits, [row])[0] for _ in range(2000)]
    assert max(got) < nucleus
    assert sum(t >= TOP_P_FIRST for t in got) > 1000  # the tail past the first tokens is drawn


def test_penalties_and_logit_bias_change_the_logits_as_specified():
    V = 8
    base = torch.linspace(-2.0, 2.0, V)[None, :]
    row = Row(SamplingParams(presence_penalty=0.5, frequency_penalty=0.25, repetition_penalty=1.5,
                             logit_bias=((0, 3.0), (7, -100.0))),
              prompt_ids=[1], output_ids=[6, 6, 2])
    got = base.clone()
    _penalise(got, [0], [row])
    want = base[0].clone()
    for t in (1, 2, 6):  # seen in prompt or output: repetition penalty by sign
        want[t] = want[t] / 1.5 if want[t] > 0 else want[t] * 1.5
    want[6] -= 2 * 0.25 + 0.5  # twice in the output
    want[2] -= 1 * 0.25 + 0.5
    want[0] += 3.0
    want[7] -= 100.0
    assert torch.allclose(got[0], want)


def test_penalties_and_bias_change_the_greedy_choice():
    logits = torch.tensor([[0.0, 5.0, 4.9, 0.0]])
    plain = Row(SamplingParams(), output_ids=[1])
    assert tokens(logits, [plain]) == [1]
    assert tokens(logits, [Row(SamplingParams(presence_penalty=0.5), output_ids=[1])]) == [2]
    assert tokens(logits, [Row(SamplingParams(logit_bias=((3, 100.0),)))]) == [3]
    assert tokens(logits, [Row(SamplingParams(logit_bias=((1, -100.0),)))]) == [2]
    assert torch.equal(logits, torch.tensor([[0.0, 5.0, 4.9, 0.0]]))  # the model's logits untouched


def test_logprobs_are_the_log_softmax_of_the_model_logits():
    logits = torch.randn(3, 50, generator=torch.Generator().manual_seed(1))
    rows = [Row(SamplingParams(logprobs=3)), Row(SamplingParams()),
            Row(SamplingParams(temperature=1.0, seed=2, logprobs=0, presence_penalty=1.0), output_ids=[4])]
    toks, lps = sample(logits, rows)
    ref = torch.log_softmax(logits, -1)
    assert lps[1] is None
    assert lps[0].token == toks[0] and lps[0].logprob == pytest.approx(float(ref[0, toks[0]]), abs=1e-6)
    best = ref[0].topk(3)
    assert [t for t, _ in lps[0].top] == best.indices.tolist()
    assert [v for _, v in lps[0].top] == pytest.approx(best.values.tolist(), abs=1e-6)
    assert lps[2].top == () and lps[2].logprob == pytest.approx(float(ref[2, toks[2]]), abs=1e-6)


def test_invalid_params_are_rejected():
    for kw in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"stop": ("",)}, {"top_k": -1},
               {"min_p": 1.5}, {"presence_penalty": 3}, {"frequency_penalty": -2.5}, {"repetition_penalty": 0},
               {"logit_bias": ((1, 101.0),)}, {"logprobs": 21}):
        with pytest.raises(ValueError):
            SamplingParams(**kw)
