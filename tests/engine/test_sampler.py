import pytest
import torch

from swarmfactory.engine import SamplingParams
from swarmfactory.engine.sampler import sample


def test_greedy_is_argmax_with_lowest_id_on_ties():
    logits = torch.tensor([[0.0, 3.0, 3.0, 1.0], [5.0, 0.0, 0.0, 0.0]])
    assert sample(logits, [SamplingParams()] * 2, [None, None]) == [1, 0]


def test_seeded_sampling_is_reproducible_and_varies_with_seed():
    logits = torch.randn(1, 1000, generator=torch.Generator().manual_seed(0))
    p = SamplingParams(temperature=1.0)
    draw = lambda seed: [sample(logits, [p], [g])[0] for g in [torch.Generator().manual_seed(seed)] for _ in range(20)]
    assert draw(1) == draw(1)
    assert draw(1) != draw(2)


def test_top_p_keeps_only_the_nucleus():
    logits = torch.log(torch.tensor([[0.5, 0.3, 0.15, 0.05]]))
    p = SamplingParams(temperature=1.0, top_p=0.7)
    g = torch.Generator().manual_seed(0)
    draws = {sample(logits, [p], [g])[0] for _ in range(200)}
    assert draws == {0, 1}


def test_invalid_params_are_rejected():
    for kw in ({"max_tokens": 0}, {"temperature": -1}, {"top_p": 0}, {"stop": ("",)}):
        with pytest.raises(ValueError):
            SamplingParams(**kw)
