"""Sharing a model the timm way (issue 21 item 9): ``vitmix.save_pretrained`` / ``push_to_hub`` write
timm's config + safetensors + a model card, and ``timm.create_model("local-dir:DIR", pretrained=True)``
rebuilds the exact model, mixer included. No network: the Hub is replaced by a local folder."""
import json
import shutil

import pytest
import timm
import torch

import vitmix
from vitmix import mixers
from vitmix.train.checkpoint import save_weights


def _round_trip(model, tmp_path):
    out = vitmix.save_pretrained(model, tmp_path / "shared")
    assert {p.name for p in out.iterdir()} == {"config.json", "model.safetensors", "README.md"}
    return out, timm.create_model(f"local-dir:{out}", pretrained=True).eval()


def _assert_same_outputs(model, loaded, size):
    x = torch.randn(2, 3, *size, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), model.eval()(x), rtol=0, atol=0)


@pytest.mark.parametrize("name,kwargs,size", [
    ("vit_nano_patch4_32", dict(mixer="laplacian", depth=2), (32, 32)),
    ("laplacianformer_tiny", dict(img_size=64, num_classes=3), (64, 64)),
    # a timm ViT whose attention vitmix swaps: the config names the mixer, not its class
    ("deit_tiny_patch16_224", dict(mixer="soft", mixer_options={"newton_iters": 5}, img_size=(48, 64), depth=2,
                                   num_classes=4), (48, 64)),
    ("deit_tiny_patch16_224", dict(mixer="linformer", img_size=64, depth=1, num_classes=4), (64, 64)),
], ids=["vit_nano-laplacian", "laplacianformer_tiny", "deit-soft-options", "deit-linformer"])
def test_local_dir_round_trip_rebuilds_the_exact_model(name, kwargs, size, tmp_path):
    torch.manual_seed(0)
    model = vitmix.create_model(name, **kwargs)
    out, loaded = _round_trip(model, tmp_path)
    _assert_same_outputs(model, loaded, size)
    config = json.loads((out / "config.json").read_text())
    assert config["architecture"] == name
    assert config["model_args"].get("mixer") == kwargs.get("mixer")
    card = (out / "README.md").read_text()
    named = kwargs.get("mixer") or "laplacian"              # no mixer= given: the architecture's own is named
    assert f"**Token mixer:** `{named}`" in card
    assert f'timm.create_model("local-dir:{out}", pretrained=True)' in card


def test_a_mixer_class_given_to_timm_is_saved_by_name(tmp_path):
    torch.manual_seed(0)
    model = timm.create_model("deit_tiny_patch16_224", img_size=32, depth=1, num_classes=3,
                              attn_layer=mixers.timm_attn("laplacian", newton_iters=4))
    out, loaded = _round_trip(model, tmp_path)
    args = json.loads((out / "config.json").read_text())["model_args"]
    assert "attn_layer" not in args and args["mixer"] == "laplacian" and args["mixer_options"] == {"newton_iters": 4}
    assert loaded.blocks[0].attn.bound_options == {"newton_iters": 4}
    assert "attn_layer" in model._model_args                       # the model itself is left as it was
    _assert_same_outputs(model, loaded, (32, 32))


def _fake_run(tmp_path):
    """A run directory as ``vitmix train`` leaves it: ``best.safetensors`` with its metadata, ``summary.json``."""
    torch.manual_seed(0)
    meta = {"model": "vit_nano_patch4_32", "mixer": "soft", "mixer_options": {"newton_iters": 3},
            "model_options": {"depth": 1}, "img_size": 8, "num_classes": 10, "in_chans": 1, "data": "digits",
            "epoch": 3, "val_acc": 91.25}
    model = vitmix.create_model("vit_nano_patch4_32", mixer="soft", mixer_options={"newton_iters": 3}, depth=1,
                                img_size=8, in_chans=1, num_classes=10)
    run = tmp_path / "run"
    run.mkdir()
    save_weights(model, run / "best.safetensors", meta)
    (run / "summary.json").write_text(json.dumps({"best_val_acc": 91.25, "final_val_acc": 90.0}))
    return run


def test_a_run_directory_is_shared_with_its_data_accuracy_and_normalisation(tmp_path):
    run = _fake_run(tmp_path)
    out = vitmix.save_pretrained(run, tmp_path / "shared")
    card = (out / "README.md").read_text()
    for fact in ("`soft`", "`newton_iters=3`", "digits", "91.25", "epoch 3"):
        assert fact in card, fact
    config = json.loads((out / "config.json").read_text())
    cfg = config["pretrained_cfg"]
    assert cfg["mean"] == [0.5] and cfg["std"] == [0.5] and cfg["input_size"] == [1, 8, 8]
    assert config["label_names"] == [str(i) for i in range(10)]
    loaded = timm.create_model(f"local-dir:{out}", pretrained=True).eval()
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), vitmix.load_model(run)(x), rtol=0, atol=0)


class _FakeHub:
    """Stands in for ``huggingface_hub.HfApi`` inside timm: uploads are copied to a local folder."""

    def __init__(self, root):
        self.root, self.calls = root, []

    def __call__(self, **kwargs):
        return self

    def create_repo(self, repo_id, private=False, exist_ok=False):
        self.calls.append(("create_repo", repo_id, private))
        return type("RepoUrl", (), {"repo_id": repo_id})()

    def file_exists(self, repo_id, filename, revision=None):
        return False

    def upload_folder(self, repo_id, folder_path, revision=None, create_pr=False, commit_message=""):
        self.calls.append(("upload_folder", repo_id, commit_message))
        shutil.copytree(folder_path, self.root / repo_id.replace("/", "--"))
        return f"https://hub.invalid/{repo_id}"


def test_push_to_hub_goes_through_timm_and_uploads_a_loadable_folder(tmp_path, monkeypatch):
    hub = _FakeHub(tmp_path)
    monkeypatch.setattr(timm.models._hub, "HfApi", hub)
    result = vitmix.push_to_hub(_fake_run(tmp_path), "someone/digits-soft", commit_message="share", private=True)
    assert result == "https://hub.invalid/someone/digits-soft"
    assert hub.calls == [("create_repo", "someone/digits-soft", True),
                         ("upload_folder", "someone/digits-soft", "share")]
    folder = tmp_path / "someone--digits-soft"
    card = (folder / "README.md").read_text()
    assert "`soft`" in card and "91.25" in card and 'timm.create_model("hf-hub:someone/digits-soft"' in card
    loaded = timm.create_model(f"local-dir:{folder}", pretrained=True)   # what hf-hub: downloads, read locally
    assert loaded.blocks[0].attn.mixer_name == "soft"


def test_what_cannot_be_shared_is_a_one_line_error(tmp_path):
    with pytest.raises(ValueError, match="not built by vitmix.create_model or timm.create_model") as err:
        vitmix.save_pretrained(torch.nn.Linear(2, 2), tmp_path / "x")
    assert "\n" not in str(err.value)
    model = timm.create_model("deit_tiny_patch16_224", img_size=32, depth=1, act_layer=torch.nn.GELU)
    with pytest.raises(ValueError, match="act_layer=.* is not JSON"):
        vitmix.save_pretrained(model, tmp_path / "y")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        vitmix.save_pretrained(tmp_path / "no-such-run", tmp_path / "z")


def test_load_model_of_a_run_carries_the_runs_data_config(tmp_path):
    """Regression: a 1-channel 8×8 digits run loaded with 3 channels, 32×32 and mean 0.5×3 in its
    pretrained_cfg, so timm's resolve_data_config built the wrong preprocessing."""
    from timm.data import resolve_data_config

    model = vitmix.load_model(_fake_run(tmp_path))
    config = resolve_data_config(model=model)
    assert config["input_size"] == (1, 8, 8) and config["mean"] == (0.5,) and config["std"] == (0.5,)
    assert config["crop_pct"] == 1.0 and model.default_cfg is model.pretrained_cfg
    assert vitmix.create_model("vit_nano_patch4_32").pretrained_cfg["input_size"] == (3, 32, 32)   # untouched
