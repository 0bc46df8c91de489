"""Helpers behind `vitmix analyze`: real images, checkpoints, activations, statistics."""
import pytest
import torch

import vitmix
from vitmix.analysis._common import capture_mixer_inputs, load_images, query_key_value
from vitmix.analysis.distances import tail_stats
from vitmix.analysis.injectivity import distinct_fraction, shift_beyond_keys


def test_load_images_digits():
    x, desc = load_images(5, 16, "digits", seed=1)
    assert x.shape == (5, 3, 16, 16) and "digits" in desc
    assert abs(float(x.mean())) < 1e-4 and float(x.std()) == pytest.approx(1.0, rel=1e-3)
    assert not torch.equal(x[0], x[1])


def test_fashion_mnist_images_come_through_the_one_idx_reader(tmp_path):
    """load_images reads the gzipped IDX files Debian installs (the test split first) with vitmix.data's reader."""
    import gzip

    import numpy as np

    images = np.random.default_rng(0).integers(0, 256, (6, 28, 28), dtype=np.uint8)
    header = bytes([0, 0, 0x08, 3]) + b"".join(int(d).to_bytes(4, "big") for d in images.shape)
    with gzip.open(tmp_path / "t10k-images-idx3-ubyte.gz", "wb") as fh:
        fh.write(header + images.tobytes())
    x, desc = load_images(6, 28, "fashion-mnist", fashion_dir=str(tmp_path))
    assert "t10k-images-idx3-ubyte.gz" in desc and x.shape == (6, 3, 28, 28)
    ref = torch.from_numpy(images.astype(np.float32) / 255.0)
    ref = (ref - ref.mean()) / ref.std()
    torch.testing.assert_close(x[:, 0], ref, rtol=1e-5, atol=1e-5)   # all 6 chosen, in file order; 28 px: no resize


def test_missing_fashion_mnist_is_a_clear_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="dataset-fashion-mnist"):
        load_images(2, 28, "fashion-mnist", fashion_dir=str(tmp_path))
    x, desc = load_images(2, 28, "auto", fashion_dir=str(tmp_path))  # auto falls back to digits
    assert "digits" in desc


def test_checkpoint_round_trip(tmp_path):
    """Analyses read checkpoints through vitmix.train's loader: DDP prefixes and {"model": ...} wrappers
    are removed, another classifier head is tolerated, any other mismatch is an error."""
    from vitmix.train.checkpoint import read_state_dict

    model = vitmix.create_model("vit_nano_patch4_32")
    path = tmp_path / "ckpt.pt"
    torch.save({"model": {f"module.{k}": v for k, v in model.state_dict().items()}}, path)
    state = read_state_dict(str(path))
    assert set(state) == set(model.state_dict())
    from vitmix.analysis._common import build_model

    with torch.no_grad():
        model.blocks[0].attn.qkv.weight.mul_(3)
    torch.save(model.state_dict(), path)
    loaded = build_model("vit_nano_patch4_32", 32, checkpoint=str(path), seed=123)
    assert torch.equal(loaded.blocks[0].attn.qkv.weight, model.blocks[0].attn.qkv.weight)
    three = vitmix.create_model("vit_nano_patch4_32", num_classes=3)     # another classifier head is fine
    torch.save(three.state_dict(), path)
    loaded = build_model("vit_nano_patch4_32", 32, checkpoint=str(path), seed=123)
    assert torch.equal(loaded.blocks[0].attn.qkv.weight, three.blocks[0].attn.qkv.weight)
    assert loaded.head.weight.shape[0] == model.head.weight.shape[0]
    other = vitmix.create_model("vit_tiny_patch4_32")
    torch.save(other.state_dict(), path)
    with pytest.raises(ValueError, match="does not match"):
        build_model("vit_nano_patch4_32", 32, checkpoint=str(path))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        build_model("vit_nano_patch4_32", 32, checkpoint=str(tmp_path / "missing.pt"))


@pytest.mark.parametrize("mixer", ["softmax", "soft", "laplacian", "fibottention"])
def test_activations_and_qkv_for_every_mixer(mixer):
    model = vitmix.create_model("vit_nano_patch4_32", mixer=mixer).eval()
    layers = capture_mixer_inputs(model, torch.randn(2, 3, 32, 32))
    assert len(layers) == 6 and all(x.shape == (2, 65, 128) for _, _, x in layers)
    q, k, v = query_key_value(layers[0][1], layers[0][2])
    assert q.shape == k.shape == v.shape == (2, 4, 65, 32)
    if mixer == "soft":
        assert q is k  # SOFT ties keys to queries


def test_tail_stats_of_known_samples():
    g = torch.Generator().manual_seed(0)
    normal = tail_stats(torch.randn(200_000, generator=g))
    assert abs(normal["excess_kurtosis"]) < 0.1
    heavy = tail_stats(torch.distributions.StudentT(5.0).sample((200_000,)))
    assert heavy["excess_kurtosis"] > 2  # t(5) has excess kurtosis 6


def test_distinct_fraction_counts_collisions():
    q = torch.tensor([[[0.0], [1.0], [2.0], [2.0]]])   # queries 2 and 3 are the same query
    rows = torch.tensor([[[1.0, 0.0], [1.0, 0.0], [0.0, 1.0], [0.0, 1.0]]])
    # 0 and 1 are distinct queries with the same row; 2 and 3 are not distinct queries
    assert distinct_fraction(rows, q, 1e-6) == pytest.approx(0.5)
    shifted = shift_beyond_keys(torch.randn(1, 1, 10, 4), torch.randn(1, 1, 10, 4))
    assert shifted.shape == (1, 1, 10, 4)
