import pytest

from swarmfactory.engine.config import ConfigError, EngineConfig


def test_defaults_describe_a_q4_1_build():
    c = EngineConfig()
    assert c.weights == "q4_1" and c.model is None and c.kernels == {}
    assert c.resolved_threads() >= 1


def test_unknown_key_is_rejected_with_its_name():
    with pytest.raises(ConfigError, match="unknown key 'max_batchsize'"):
        EngineConfig.from_dict({"max_batchsize": 4})


def test_unknown_op_in_kernels_is_rejected():
    with pytest.raises(ConfigError, match="unknown op 'softmax'"):
        EngineConfig.from_dict({"kernels": {"softmax": "dense"}})
    with pytest.raises(ConfigError, match="the attention op runs the engine's own code or a kernel-factory kernel"):
        EngineConfig.from_dict({"kernels": {"attention": "dense"}})


def test_bad_weight_format_names_the_choices():
    with pytest.raises(ConfigError, match="weights"):
        EngineConfig.from_dict({"weights": "q5_k"})


def test_config_is_frozen():
    c = EngineConfig()
    with pytest.raises(Exception):
        c.weights = "fp32"


def test_yaml_round_trip(tmp_path):
    c = EngineConfig(weights="bf16", max_batch=4, kernels={"lm_head": "dense"})
    p = tmp_path / "engine.yaml"
    p.write_text(c.to_yaml())
    assert EngineConfig.from_yaml(p) == c


def test_yaml_with_unknown_key_fails_clearly(tmp_path):
    p = tmp_path / "engine.yaml"
    p.write_text("weights: bf16\nthreadz: 2\n")
    with pytest.raises(ConfigError, match="threadz"):
        EngineConfig.from_yaml(p)
