"""ImageNet-C corruptions (vitmix.data.corruptions), corruption accuracy (vitmix.train.robustness) and
`vitmix eval --corruptions`: every corruption keeps shape/dtype/range, grows with severity, repeats
for a seed whatever the batching, and does what its name says (checked against an independent
reference where one exists: scipy, PIL, colorsys, a per-pixel loop)."""
import colorsys
import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from vitmix.cli import main
from vitmix.data import build_datasets
from vitmix.data.corruptions import (
    CORRUPTIONS, box_matrix, corrupt, disk_kernel, get_corruption, image_generators, list_corruptions, motion_taps,
    parse_corruptions, parse_severities,
)
from vitmix.train import TrainConfig, evaluate_checkpoint, load_model, train
from vitmix.train.robustness import evaluate_corruptions, without_normalization

NAMES = list_corruptions()
RANDOM = [n for n in NAMES if CORRUPTIONS[n].random]


@pytest.fixture(scope="module")
def digits():
    """16 validation digits at 16 px in [0, 1] (the transform without its Normalize)."""
    _, val, _ = build_datasets("digits", 16, augment=False)
    plain, stats = without_normalization(val)
    assert stats == ((0.5,), (0.5,))
    return torch.stack([plain[i][0] for i in range(16)])


def smooth_rgb(batch=3, height=13, width=17, seed=0):
    """Smooth random RGB images (odd, non-square) in [0, 1]."""
    gen = torch.Generator().manual_seed(seed)
    return F.interpolate(torch.rand(batch, 3, 5, 6, generator=gen), size=(height, width), mode="bilinear",
                         align_corners=True)


def distance(a, b):
    return (a - b).abs().mean().item()


# --- every corruption -----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", NAMES)
def test_shape_dtype_and_range_are_kept(name):
    for images in (smooth_rgb(), smooth_rgb(batch=1).double(), smooth_rgb(batch=2)[:, :1], smooth_rgb()[0]):
        out = corrupt(images, name, 5, seed=1)
        assert out.shape == images.shape and out.dtype == images.dtype
        assert torch.isfinite(out).all() and out.min() >= 0 and out.max() <= 1


@pytest.mark.parametrize("name", NAMES)
def test_distance_from_the_clean_images_grows_with_severity(name, digits):
    distances = [0.0] + [distance(corrupt(digits, name, s), digits) for s in range(1, 6)]
    assert all(b > a for a, b in zip(distances, distances[1:])), distances


@pytest.mark.parametrize("name", NAMES)
def test_a_seed_repeats_whatever_the_batching(name):
    images = smooth_rgb(batch=5)
    whole = corrupt(images, name, 3, seed=7)
    assert torch.equal(whole, corrupt(images, name, 3, seed=7))
    # The same images in other batches (keyed by their dataset index) give the same result; 1e-6
    # allows a convolution to block a different batch size differently.
    parts = torch.cat([corrupt(images[:2], name, 3, seed=7, indices=[0, 1]),
                       corrupt(images[2:][[2, 0, 1]], name, 3, seed=7, indices=[4, 2, 3])[[1, 2, 0]]])
    torch.testing.assert_close(parts, whole, atol=1e-6, rtol=0)
    other_seed = corrupt(images, name, 3, seed=8)
    assert torch.equal(other_seed, whole) != (name in RANDOM)   # only the random ones depend on the seed
    if name in RANDOM:      # and each image has its own stream: two copies of one image differ
        twin = corrupt(images[:1].expand(2, -1, -1, -1), name, 3, seed=7)
        assert not torch.equal(twin[0], twin[1])


def test_names_severities_and_images_are_checked():
    with pytest.raises(ValueError, match="Did you mean: gaussian_noise"):
        corrupt(smooth_rgb(), "gausian_noise", 1)
    with pytest.raises(ValueError, match="Did you mean: contrast"):
        parse_corruptions("gaussian_noise,contrst")
    assert parse_corruptions("all") == NAMES == parse_corruptions(None)
    assert parse_corruptions(" contrast,pixelate,contrast") == ["contrast", "pixelate"]
    assert parse_severities("5,1,3,1") == (1, 3, 5)
    for bad in ("0", "1,6", "1,x", "", [2.5], [True]):
        with pytest.raises(ValueError, match="1 to 5|from 1 to 5"):
            parse_severities(bad)
    with pytest.raises(ValueError, match=r"in \[0, 1\]"):
        corrupt(smooth_rgb() * 2 - 1, "contrast", 1)          # normalised images
    with pytest.raises(ValueError, match="channels"):
        corrupt(torch.rand(2, 2, 8, 8), "contrast", 1)
    with pytest.raises(ValueError, match="float tensor"):
        corrupt(torch.zeros(1, 8, 8, dtype=torch.uint8), "contrast", 1)
    with pytest.raises(ValueError, match="3 indices for 5 images"):
        corrupt(smooth_rgb(batch=5), "shot_noise", 1, indices=[0, 1, 2])


def test_parameters_scale_with_the_image_side_above_32_pixels_only():
    motion = get_corruption("motion_blur")
    assert motion.parameters(1, 16) == motion.parameters(1, 32) == (6, 1.0)
    assert motion.parameters(1, 224) == pytest.approx((42, 7.0))
    assert get_corruption("defocus_blur").parameters(5, 64) == pytest.approx((3.0, 0.1))   # anti-aliasing kept
    assert get_corruption("gaussian_noise").parameters(2, 224) == 0.06


# --- what each corruption does --------------------------------------------------------------------------------

GREY = torch.full((4, 1, 64, 64), 0.5)


def test_gaussian_noise_has_zero_mean_and_its_standard_deviation():
    residual = corrupt(GREY, "gaussian_noise", 1) - GREY       # σ = 0.04: no clipping at 0.5 ± 12σ
    n = residual.numel()
    assert abs(residual.mean().item()) < 4 * 0.04 / math.sqrt(n)
    assert residual.std().item() == pytest.approx(0.04, rel=4 / math.sqrt(2 * n))    # 4 standard errors


def test_shot_noise_is_poisson():
    out = corrupt(GREY, "shot_noise", 1)                       # 500 photons at full scale
    counts = out * 500
    assert torch.allclose(counts, counts.round(), atol=1e-3)   # whole photon counts
    assert abs(out.mean().item() - 0.5) < 4 * math.sqrt(0.5 / 500 / out.numel())
    assert out.var().item() == pytest.approx(0.5 / 500, rel=0.05)     # Poisson: variance = mean / photons


def test_impulse_noise_sets_a_fraction_of_values_to_0_or_1():
    out = corrupt(GREY, "impulse_noise", 5)                    # 7 % of the values
    hit = out != 0.5
    assert set(out[hit].unique().tolist()) == {0.0, 1.0}
    assert hit.float().mean().item() == pytest.approx(0.07, abs=4 * math.sqrt(0.07 * 0.93 / out.numel()))
    assert (out[hit] == 1).float().mean().item() == pytest.approx(0.5, abs=0.05)


def test_speckle_noise_is_multiplicative():
    images = torch.cat([GREY[:2], torch.zeros(2, 1, 64, 64)])
    out = corrupt(images, "speckle_noise", 5)                  # σ = 0.2 of the value
    assert torch.equal(out[2:], images[2:])                    # black stays black
    assert (out[:2] - 0.5).std().item() == pytest.approx(0.5 * 0.2, rel=0.05)


def test_gaussian_blur_matches_scipy_with_replicated_edges():
    from scipy.ndimage import gaussian_filter

    images = smooth_rgb(batch=2).double()
    images = (images + 0.3 * torch.rand(images.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
              ).clamp(0, 1)
    for severity in (1, 5):
        sigma = get_corruption("gaussian_blur").parameters(severity, 13)
        expected = gaussian_filter(images.numpy(), sigma=(0, 0, sigma, sigma), mode="nearest", truncate=4.0)
        np.testing.assert_allclose(corrupt(images, "gaussian_blur", severity).numpy(), expected, atol=1e-12)


def test_defocus_kernel_is_an_antialiased_disk_and_blurs_like_scipy():
    from scipy.ndimage import correlate

    box = torch.zeros(5, 5, dtype=torch.float64)
    box[1:4, 1:4] = 1 / 9                                      # radius 1.5: the 3×3 block
    torch.testing.assert_close(disk_kernel(1.5, 0.1), F.pad(box, (1, 1, 1, 1)), atol=1e-20, rtol=0)
    g = torch.tensor([math.exp(-1 / (2 * 0.4 ** 2)), 1.0, math.exp(-1 / (2 * 0.4 ** 2))], dtype=torch.float64)
    g /= g.sum()                                               # radius 0.3: one pixel, then the 3×3 Gaussian
    torch.testing.assert_close(disk_kernel(0.3, 0.4), F.pad(torch.outer(g, g), (1, 1, 1, 1)), atol=1e-15, rtol=0)
    for r, alias in ((1.0, 0.2), (12.5, 0.5)):
        k = disk_kernel(r, alias)
        assert k.sum().item() == pytest.approx(1.0) and torch.allclose(k, k.T) and torch.allclose(k, k.flip(0))
    images = smooth_rgb(batch=2).double()
    expected = np.stack([[correlate(c, disk_kernel(1.5, 0.1).numpy(), mode="mirror") for c in im]
                         for im in images.numpy()])
    np.testing.assert_allclose(corrupt(images, "defocus_blur", 5).numpy(), expected, atol=1e-12)


def test_motion_blur_matches_a_per_pixel_loop():
    images = smooth_rgb(batch=2, height=9, width=11).double()
    out = corrupt(images, "motion_blur", 2, seed=3, indices=[5, 6])
    radius, sigma = get_corruption("motion_blur").parameters(2, 9)
    expected = torch.zeros_like(images)
    for b, gen in enumerate(image_generators(3, "motion_blur", 2, [5, 6])):
        angle = 45.0 * (2 * float(torch.rand((), generator=gen)) - 1)
        for dy, dx, w in motion_taps(radius, sigma, angle):
            for i in range(9):
                for j in range(11):
                    expected[b, :, i, j] += w * images[b, :, min(max(i + dy, 0), 8), min(max(j + dx, 0), 10)]
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    taps = motion_taps(6, 1.0, 30.0)
    assert len(taps) == 13 and taps[0][:2] == (0, 0) and sum(t[2] for t in taps) == pytest.approx(1.0)
    # Every tap lies on the line through the pixel at 30° (to the rounding of integer offsets).
    assert all(abs(dy * math.cos(math.radians(30)) - dx * math.sin(math.radians(30))) <= 0.5 * math.sqrt(2)
               for dy, dx, _ in taps)


def test_zoom_blur_zooms_about_the_centre():
    images = smooth_rgb(batch=2, height=15, width=15)
    out = corrupt(images, "zoom_blur", 5)
    torch.testing.assert_close(out[..., 7, 7], images[..., 7, 7], atol=1e-6, rtol=0)   # the centre stays
    torch.testing.assert_close(corrupt(images.flip(-1), "zoom_blur", 5), out.flip(-1), atol=1e-6, rtol=0)
    torch.testing.assert_close(corrupt(torch.full((1, 3, 15, 15), 0.3), "zoom_blur", 5),
                               torch.full((1, 3, 15, 15), 0.3), atol=1e-6, rtol=0)


def test_brightness_adds_to_the_hsv_value():
    images = smooth_rgb(batch=2).double()
    images[0, :, 0, 0] = 0                                     # a black pixel
    out = corrupt(images, "brightness", 5)                     # V + 0.3
    expected = images.clone()
    for b in range(2):
        for i in range(13):
            for j in range(17):
                h, s, v = colorsys.rgb_to_hsv(*images[b, :, i, j].tolist())
                expected[b, :, i, j] = torch.tensor(colorsys.hsv_to_rgb(h, s, min(v + 0.3, 1.0)), dtype=torch.float64)
    torch.testing.assert_close(out, expected, atol=1e-12, rtol=0)
    grey = smooth_rgb()[:, :1]
    torch.testing.assert_close(corrupt(grey, "brightness", 2), (grey + 0.1).clamp(max=1))
    assert out.mean() > images.mean()


def test_contrast_shrinks_each_channel_towards_its_mean():
    images = smooth_rgb().double()
    out = corrupt(images, "contrast", 4)                       # factor 0.3
    mean = images.mean(dim=(-2, -1), keepdim=True)
    torch.testing.assert_close(out.mean(dim=(-2, -1), keepdim=True), mean, atol=1e-12, rtol=0)
    torch.testing.assert_close(out - mean, 0.3 * (images - mean), atol=1e-12, rtol=0)


def test_pixelate_matches_pil_box_resizes_and_is_constant_on_blocks():
    from PIL import Image

    for side in (13, 16, 29, 32):
        image = torch.rand(1, 1, side, side, generator=torch.Generator().manual_seed(side))
        for severity in (1, 3, 5):
            factor = get_corruption("pixelate").parameters(severity, side)
            small = int(side * factor)
            pil = Image.fromarray(image[0, 0].numpy(), mode="F").resize((small, small), Image.BOX)
            expected = torch.from_numpy(np.asarray(pil.resize((side, side), Image.BOX)).copy())
            out = corrupt(image, "pixelate", severity)[0, 0]
            torch.testing.assert_close(out, expected, atol=1e-6, rtol=0)
            # Each output row (column) copies one low-resolution row (column): rows that copy the same one are equal.
            source = box_matrix(small, side).argmax(1)
            for a in range(side):
                for b in range(side):
                    if source[a] == source[b]:
                        assert torch.equal(out[a], out[b]) and torch.equal(out[:, a], out[:, b])


def test_jpeg_changes_the_image_a_little_and_more_at_lower_quality(digits):
    mild, harsh = corrupt(digits, "jpeg_compression", 1), corrupt(digits, "jpeg_compression", 5)
    assert 0 < distance(mild, digits) < 0.02 < 2 * distance(harsh, digits)     # quality 80 is close, 40 less so
    assert torch.equal((mild * 255).round(), mild * 255)       # decoded 8-bit values
    assert corrupt(smooth_rgb(), "jpeg_compression", 1).shape == (3, 3, 13, 17)


# --- accuracy under corruption and `vitmix eval --corruptions` --------------------------------------------------

TINY = dict(model="vit_nano_patch4_32", data="digits", img_size=16, batch_size=64, lr=3e-3, warmup_epochs=0.2,
            model_options={"depth": 2, "embed_dim": 64, "num_heads": 2}, mixer="softmax")


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("runs") / "tiny"
    train(TrainConfig(**TINY, epochs=1, train_subset=256, out=str(out)), log=lambda *a: None)
    return out


class FixedLinear(torch.nn.Module):
    """A fixed random linear classifier, in float64 so that batching cannot move a prediction."""

    def __init__(self, pixels, classes=3):
        super().__init__()
        self.weight = torch.nn.Parameter(torch.randn(pixels, classes, generator=torch.Generator().manual_seed(0),
                                                     dtype=torch.float64))

    def forward(self, x):
        return x.flatten(1).double() @ self.weight


def test_evaluate_corruptions_matches_a_one_batch_reference():
    """The batched evaluation (odd batch size, Normalize moved behind the corruption) against the
    obvious computation: every image corrupted at once, normalised by hand, classified."""
    from torchvision.transforms import Compose, Normalize, ToTensor

    from vitmix.data.datasets import ArrayImageDataset

    gen = torch.Generator().manual_seed(0)
    pixels = (F.interpolate(torch.rand(40, 1, 4, 4, generator=gen), size=12, mode="bilinear") * 255).round()
    images = pixels.to(torch.uint8)[:, 0].numpy()
    model = FixedLinear(144)
    plain = torch.from_numpy(images).float()[:, None] / 255
    labels = model((plain - 0.4) / 0.2).argmax(1)             # the clean predictions: 100 % clean accuracy
    data = ArrayImageDataset(images, labels.numpy(), Compose([ToTensor(), Normalize((0.4,), (0.2,))]))
    names, severities = ["impulse_noise", "motion_blur", "brightness"], (1, 4)
    result = evaluate_corruptions(model, data, corruptions=names, severities=severities, seed=5, batch_size=7,
                                  progress=False)
    assert result["clean"] == 100.0
    for name in names:
        for s in severities:
            corrupted = corrupt(plain, name, s, seed=5)
            expected = 100 * (model((corrupted - 0.4) / 0.2).argmax(1) == labels).double().mean().item()
            assert result["per_corruption"][name][s] == pytest.approx(expected, abs=1e-12), (name, s)
    table = [result["per_corruption"][n][s] for n in names for s in severities]
    assert result["mean"] == pytest.approx(sum(table) / len(table))
    assert result["corruption_mean"]["brightness"] == pytest.approx(sum(result["per_corruption"]["brightness"].values())
                                                                     / 2)
    assert result["severity_mean"][4] == pytest.approx(sum(result["per_corruption"][n][4] for n in names) / 3)
    assert result["drop"] == pytest.approx(100 - result["mean"]) and result["mean"] < 100
    assert result["relative_drop"] == pytest.approx(result["drop"])   # clean = 100 %
    assert result["images"] == 40 and result["image_size"] == [12, 12]
    # A loader lends its batch size, not its order: the same numbers from a shuffling loader.
    loader = torch.utils.data.DataLoader(data, batch_size=9, shuffle=True)
    again = evaluate_corruptions(model, loader, corruptions=names, severities=severities, seed=5, progress=False)
    assert again["per_corruption"] == result["per_corruption"]


def test_evaluate_corruptions_checks_its_input_before_evaluating():
    class Unreadable(torch.utils.data.Dataset):
        def __len__(self):
            return 4

        def __getitem__(self, i):
            raise AssertionError("an image was read")

    model = FixedLinear(16)
    with pytest.raises(ValueError, match="Did you mean: pixelate"):
        evaluate_corruptions(model, Unreadable(), corruptions="pixelat", progress=False)
    with pytest.raises(ValueError, match="from 1 to 5"):
        evaluate_corruptions(model, Unreadable(), severities=(0, 1), progress=False)
    normalised = torch.utils.data.TensorDataset(torch.rand(4, 1, 4, 4) * 2 - 1, torch.zeros(4, dtype=torch.long))
    with pytest.raises(ValueError, match=r"not in \[0, 1\]"):
        evaluate_corruptions(model, normalised, corruptions="contrast", progress=False)


def test_clean_accuracy_equals_vitmix_eval(run):
    _, val, _ = build_datasets("digits", 16, augment=False)
    result = evaluate_corruptions(load_model(run, device="cpu"), val, corruptions="contrast", severities="2",
                                  progress=False)
    assert result["clean"] == evaluate_checkpoint(run)["val_acc"]     # same images, same normalisation
    assert result["images"] == 360 and list(result["per_corruption"]) == ["contrast"]


def test_eval_corruptions_end_to_end(run, tmp_path, capsys):
    assert main(["eval", str(run), "--corruptions", "gaussian_noise,pixelate", "--severities", "1,5",
                 "--seed", "2"]) == 0
    printed = capsys.readouterr().out
    assert "| gaussian_noise |" in printed and "mean corruption accuracy" in printed
    result = json.loads((run / "corruptions.json").read_text())
    assert result["corruptions"] == ["gaussian_noise", "pixelate"] and result["seed"] == 2
    assert result["checkpoint"] == str(run / "best.safetensors")
    csv_rows = (run / "corruptions.csv").read_text().splitlines()
    assert csv_rows[0] == "corruption,severity,accuracy" and len(csv_rows) == 1 + 1 + 2 * 2
    assert csv_rows[1].startswith("clean,0,")
    md = (run / "corruptions.md").read_text()
    assert "| pixelate |" in md and "severity 5" in md and f"**{result['mean']:.2f}**" in md
    assert (run / "corruptions.png").stat().st_size > 10_000
    # A checkpoint file writes next to it unless --out says otherwise.
    out = tmp_path / "report"
    assert main(["eval", "--checkpoint", str(run / "last.safetensors"), "--corruptions", "contrast",
                 "--severities", "2", "--out", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["corruptions.csv", "corruptions.json", "corruptions.md",
                                                     "corruptions.png"]


def test_eval_corruption_errors_come_before_any_work(run, tmp_path, monkeypatch, capsys):
    from vitmix.train import runner

    monkeypatch.setattr(runner, "_load_checkpoint", lambda *a, **k: pytest.fail("the checkpoint was loaded"))
    cases = {"Did you mean: gaussian_noise": [str(run), "--corruptions", "gausian_noise"],
             "from 1 to 5": [str(run), "--corruptions", "all", "--severities", "1,7"],
             "add --corruptions": [str(run), "--severities", "1"],
             "give a run directory or checkpoint": ["--corruptions", "all"],
             "two different checkpoints": [str(run), "--checkpoint", str(tmp_path), "--corruptions", "all"],
             "is a file": [str(run), "--corruptions", "all", "--out", str(run / "config.yaml")],
             "does not exist": [str(tmp_path / "nope.safetensors"), "--corruptions", "all"]}
    before = sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir())
    for message, argv in cases.items():
        assert main(["eval", *argv]) == 2
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, (message, err)
    assert sorted((p.name, p.stat().st_mtime_ns) for p in run.iterdir()) == before      # nothing written
