"""The same run at any world size: global batches, per-sample augmentation and drop path, validation
shards (the end-to-end torchrun check is in test_train.py)."""
import numpy as np
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

import vitmix
from vitmix.data import build_datasets
from vitmix.data.sampling import GlobalBatchSampler, SeededSamples, rank_positions, sample_hash, sample_uniform
from vitmix.train import TrainConfig
from vitmix.runs.distributed import DistInfo, KeyedDropPath, key_drop_path
from vitmix.train.runner import world_loaders


@pytest.mark.parametrize("world", [2, 4])
def test_the_ranks_batches_make_up_the_one_process_batch_and_keep_its_mixup_pairs(world):
    global_batch = 16
    one = GlobalBatchSampler(203, global_batch, seed=3)
    ranks = [GlobalBatchSampler(203, global_batch // world, world, r, seed=3) for r in range(world)]
    for s in (one, *ranks):
        s.set_epoch(2)
    assert len(one) == len(ranks[0]) == 203 // global_batch
    for step, (full, *parts) in enumerate(zip(one, *ranks)):
        rebuilt = [None] * global_batch
        for r, part in enumerate(parts):
            for pos, key in zip(rank_positions(global_batch // world, world, r), part):
                rebuilt[pos] = key
            # timm's Mixup pairs row i with row B-1-i (flip(0)): a rank's pairs are the global batch's
            assert [full.index(k) for k in part[::-1]] == [global_batch - 1 - full.index(k) for k in part]
        assert rebuilt == full, step
    assert {i for batch in one for i, _ in batch} <= set(range(203))


def test_validation_counts_every_image_once_when_the_world_size_does_not_divide_it():
    """Regression (torch's DistributedSampler padded the shards to a multiple of the world size and
    evaluate summed them: 7 images on 2 ranks were counted as 8)."""
    train_set = TensorDataset(torch.zeros(8, 1))
    val_set = TensorDataset(torch.arange(7))
    for world in (2, 3):
        seen = []
        for rank in range(world):
            _, val_loader, _ = world_loaders(train_set, val_set, TrainConfig(batch_size=2),
                                             DistInfo(rank=rank, world_size=world))
            seen += [int(i) for (batch,) in val_loader for i in batch]
        assert sorted(seen) == list(range(7)), world


def test_a_set_smaller_than_one_global_batch_gives_one_smaller_batch_per_rank():
    sampler = GlobalBatchSampler(10, 32, world_size=2, rank=1)
    assert len(sampler) == 1 and [len(b) for b in sampler] == [5]
    with pytest.raises(ValueError, match="3 training images cannot be split over 4 processes"):
        GlobalBatchSampler(3, 32, world_size=4)


def test_each_image_is_augmented_by_seed_epoch_and_index_in_any_worker():
    train, _, _ = build_datasets("digits", 16, augment=True)
    seeded = SeededSamples(train, seed=0)
    x0, y0, i0 = seeded[(5, 0)]
    assert torch.equal(seeded[(5, 0)][0], x0) and (y0, i0) == (int(train.labels[5]), 5)
    assert not torch.equal(seeded[(5, 1)][0], x0)                 # a new epoch, a new crop
    assert not torch.equal(SeededSamples(train, seed=1)[(5, 0)][0], x0)
    torch.manual_seed(7)
    expected = torch.rand(3)
    torch.manual_seed(7)
    seeded[(9, 0)]                                                 # loading leaves torch's RNG alone
    assert torch.equal(torch.rand(3), expected)
    keys = [[(i, 3) for i in range(j, j + 4)] for j in range(0, 16, 4)]
    in_main = [b[0] for b in DataLoader(seeded, batch_sampler=keys)]
    in_workers = [b[0] for b in DataLoader(seeded, batch_sampler=keys, num_workers=2)]
    assert all(torch.equal(a, b) for a, b in zip(in_main, in_workers))


def test_drop_path_is_keyed_to_the_sample_not_the_batch_split():
    def tiny(rate=0.5):
        torch.manual_seed(0)
        return vitmix.create_model("vit_nano_patch4_32", img_size=16, in_chans=1, num_classes=10, depth=3,
                                   embed_dim=32, num_heads=2, drop_path_rate=rate)

    model, plain = tiny(), tiny()
    keys = key_drop_path(model, seed=0)
    assert sum(isinstance(m, KeyedDropPath) for m in model.modules()) == 4   # blocks 2 and 3 (rate 0 first)
    assert key_drop_path(tiny(rate=0.0), seed=0) is None
    x, index = torch.randn(8, 1, 16, 16), torch.arange(100, 108)
    model.train()
    keys.start(0, index)
    whole = model(x)
    halves = []
    for rows in (slice(0, 4), slice(4, 8)):
        keys.start(0, index[rows])
        halves.append(model(x[rows]))
    torch.testing.assert_close(torch.cat(halves), whole, rtol=1e-6, atol=1e-6)
    keys.start(1, index)
    assert not torch.allclose(model(x), whole)                     # other epoch, other masks
    assert torch.equal(model.eval()(x), plain.eval()(x))           # eval: the identity, as timm's
    kept = sample_uniform(0, 0, 1, np.arange(100_000)) < 0.8
    assert abs(kept.mean() - 0.8) < 0.005
    assert sample_hash(3, 4, 5, 17) == int(sample_hash(3, 4, 5, [17])[0])   # SeededSamples' scalar form
