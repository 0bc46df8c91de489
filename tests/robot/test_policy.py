"""The demonstration windows and the diffusion policy, on synthetic demonstrations (no simulator)."""
import pytest
import torch

from vitmix.mixers.bigbird import BigBirdAttention
from vitmix.mixers.fibottention import FibottentionAttention
from vitmix.robot.dataset import HORIZON, N_OBS, DemoWindows
from vitmix.robot.policy import DiffusionPolicy

from .conftest import needs_h5py, write_demos

@needs_h5py
def test_windows_pad_both_ends_with_the_edge_steps(tmp_path):
    data = DemoWindows(write_demos(tmp_path / "demos.hdf5", lengths=(5, 7)), "lift")
    assert len(data) == (5 + N_OBS - 1) + (7 + N_OBS - 1)           # every step starts a window
    images, proprio, actions = data[0]                               # starts one step before demo 0
    assert images.shape == (N_OBS, 2, 3, 84, 84) and images.dtype == torch.uint8
    assert proprio.shape == (N_OBS, 9)
    assert actions.shape == (HORIZON, 7)
    steps = (actions[:, 0] * 10).round().long().tolist()
    assert steps == [0, 0, 1, 2, 3, 4] + [4] * 10                   # first step repeated before, last after
    assert torch.equal(images[0], images[1])


def test_encoder_tokens_and_robot_mixers():
    policy = DiffusionPolicy("fibottention")
    vit = policy.encoder.vit
    assert vit.patch_embed.num_patches == 81 and vit.num_prefix_tokens == 1      # 81 patches + CLS
    layers = [m for m in vit.modules() if isinstance(m, FibottentionAttention)]
    assert [m.layer_idx for m in layers] == [0, 1, 2, 3] and {m.preset for m in layers} == {"robot"}
    assert {m.num_heads for m in layers} == {12}                     # ViT-B's heads: the official rows
    assert {m.mode for m in DiffusionPolicy("fibottention", "masked").encoder.modules()
            if isinstance(m, FibottentionAttention)} == {"masked"}
    assert {m.layout for m in DiffusionPolicy("bigbird").encoder.modules()
            if isinstance(m, BigBirdAttention)} == {"band"}
    # the 76² crop's last 4 rows/columns are never seen, as with the official stride-8 patch conv
    x = torch.rand(1, 3, 76, 76)
    y = x.clone()
    y[..., 72:, :] = 0
    policy.eval()
    torch.testing.assert_close(policy.encoder(x), policy.encoder(y))


@pytest.mark.parametrize("mixer", ["softmax", "fibottention", "bigbird"])
def test_policy_trains_and_samples(mixer):
    torch.manual_seed(0)
    policy = DiffusionPolicy(mixer)
    images = torch.randint(0, 255, (3, N_OBS, 2, 3, 84, 84), dtype=torch.uint8)
    proprio, actions = torch.randn(3, N_OBS, 9), torch.rand(3, HORIZON, 7) * 2 - 1
    loss = policy.loss(images, proprio, actions)
    loss.backward()
    assert torch.isfinite(loss)
    assert all(p.grad is not None for p in policy.encoder.parameters() if p.requires_grad)
    policy.eval()
    out = policy.predict(images, proprio, steps=2, generator=torch.Generator().manual_seed(0))
    assert out.shape == (3, HORIZON, 7) and out.abs().max() <= 1.0 + 1e-6


def test_crops_are_random_per_image_in_training_and_central_in_evaluation():
    policy = DiffusionPolicy()
    x = torch.arange(84.0)[None, None, None, :].expand(64, 3, 84, 84) + 100 * torch.arange(84.0)[:, None]
    crops = policy.train()._crop(x)
    assert crops.shape == (64, 3, 76, 76)
    left, top = crops[:, 0, 0, 0] % 100, crops[:, 0, 0, 0] // 100       # each crop's top-left pixel
    assert left.max() <= 8 and top.max() <= 8 and len(set(zip(left.tolist(), top.tolist()))) > 10
    for k in range(64):                                                # a crop is a contiguous window
        t, lft = int(top[k]), int(left[k])
        torch.testing.assert_close(crops[k], x[k, :, t:t + 76, lft:lft + 76])
    torch.testing.assert_close(policy.eval()._crop(x), x[..., 4:80, 4:80])
