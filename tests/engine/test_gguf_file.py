"""The GGUF container reader: the same metadata and tensor arrays as gguf-py's reader, in a
fraction of its time, and one line naming the file for anything that is not a whole GGUF file."""

from __future__ import annotations

import numpy as np
import pytest
from gguf import GGMLQuantizationType as QT
from gguf import GGUFReader

import tiny_models as tm
from swarmfactory.engine import gguf_file
from swarmfactory.engine.gguf_loader import load_gguf


@pytest.fixture(scope="module")
def tiny_file(tmp_path_factory):
    """A tiny Gemma 3 with every kind of value: strings, string and number arrays, block types."""
    model = tm.hf_model("gemma3")
    folder = tmp_path_factory.mktemp("gguf")
    return [tm.write_gguf(model, "gemma3", folder / f"g-{q.name}.gguf", q) for q in (QT.F32, QT.Q4_K, QT.BF16)]


def test_metadata_and_tensors_equal_gguf_readers(tiny_file):
    for path in tiny_file:
        ours, ref = gguf_file.read(path), GGUFReader(path)
        assert ours.metadata == {k: f.contents() for k, f in ref.fields.items() if not k.startswith("GGUF.")}
        assert [t.name for t in ours.tensors] == [t.name for t in ref.tensors]
        for a, b in zip(ours.tensors, ref.tensors):
            assert a.qtype == b.tensor_type and a.shape == tuple(int(x) for x in b.shape)
            data = np.asarray(b.data)
            assert a.data.dtype == data.dtype and a.data.shape == data.shape and np.array_equal(a.data, data), a.name


@pytest.mark.parametrize("damage", ["empty", "not_gguf", "truncated_header", "truncated_data", "version"])
def test_a_damaged_file_is_one_line_naming_it(tiny_file, tmp_path, damage):
    good = tiny_file[0].read_bytes()
    bad = {"empty": b"", "not_gguf": b"PK\x03\x04" + good[4:], "truncated_header": good[:200],
           "truncated_data": good[: len(good) - 64], "version": good[:4] + (7).to_bytes(4, "little") + good[8:]}[damage]
    path = tmp_path / "model.gguf"
    path.write_bytes(bad)
    for load in (gguf_file.read, load_gguf):
        with pytest.raises(ValueError) as e:
            load(path)
        assert "\n" not in str(e.value) and "model.gguf" in str(e.value), str(e.value)


def test_the_real_models_read_in_well_under_a_second_each(model_path, gemma_path):
    """Not a timed assert: the vocabulary arrays are decoded in one pass (gguf-py's reader takes
    ~10 s on SmolLM2's and ~20 s on Gemma's); the figures are printed for the log."""
    import time

    for path in (model_path, gemma_path):
        t0 = time.perf_counter()
        f = gguf_file.read(path)
        took = time.perf_counter() - t0
        tokens = f.metadata["tokenizer.ggml.tokens"]
        assert len(tokens) == f.tensors[[t.name for t in f.tensors].index("token_embd.weight")].shape[1]
        print(f"{path.name}: {len(tokens)} tokens, {len(f.tensors)} tensors read in {took:.2f} s")
