"""The 1-D sequence classifier ``seq_lra_tiny``: its LRA size, every 1-D mixer, one-line errors for bad input
or a 2-D mixer, and a few training steps on a tiny generated ListOps set."""
import pytest
import timm
import torch
import torch.nn.functional as F

import vitmix
from vitmix.data import build_sequence_datasets
from vitmix.models.sequence import SequenceClassifier, is_sequence_model, sequence_mixers

pytestmark = pytest.mark.usefixtures("one_thread")


def test_default_size_is_nystromformers_lra_config():
    model = timm.create_model("seq_lra_tiny")
    assert is_sequence_model("seq_lra_tiny") and not is_sequence_model("vit_nano_patch4_32")
    assert len(model.blocks) == 2 and model.pos_embed.shape == (1, 2000, 64)
    attn = model.blocks[0].attn
    assert attn.num_heads == 2 and attn.head_dim == 32 and model.blocks[0].mlp.fc1.out_features == 128
    assert type(attn).mixer_name == "softmax"
    assert model.tokens.num_embeddings == 256 and model.head[-1].out_features == 10
    out = model(model.example_inputs(2)[0])
    assert out.shape == (2, 10)


@pytest.mark.parametrize("mixer", sequence_mixers())
def test_every_1d_mixer_classifies_and_trains(mixer):
    model = vitmix.create_model("seq_lra_tiny", mixer=mixer, seq_len=48, vocab_size=16, num_classes=3)
    assert {type(b.attn).mixer_name for b in model.blocks} == {mixer}
    ids = torch.randint(0, 16, (2, 48))
    out = model(ids)
    assert out.shape == (2, 3) and torch.isfinite(out).all()
    out.square().sum().backward()
    assert model.tokens.weight.grad.abs().sum() > 0 and model.pos_embed.grad.abs().sum() > 0


def test_every_registered_mixer_works_on_1d():
    assert sequence_mixers() == vitmix.mixers.list_mixers()


def test_mixers_that_need_a_2d_grid_are_refused_naming_those_that_work(monkeypatch):
    from vitmix.mixers import TokenMixer, registry

    class ImageOnly(TokenMixer):
        spatial = True
        mixer_name = "image_only"

    monkeypatch.setitem(registry._MIXERS, "image_only", ImageOnly)
    assert "softmax" in sequence_mixers() and "image_only" not in sequence_mixers()
    with pytest.raises(ValueError, match="mixer 'image_only' needs a 2-D token grid; .*: "
                       + ", ".join(sequence_mixers())):
        vitmix.create_model("seq_lra_tiny", mixer="image_only", seq_len=16)


def test_weightformer_is_refused_as_an_image_model_in_one_line():
    with pytest.raises(ValueError, match="'weightformer' is an image model .*weightformer_base.*not a token mixer: "
                       "it works on a 2-D patch grid by design") as err:
        vitmix.create_model("seq_lra_tiny", mixer="weightformer", seq_len=16)
    assert "\n" not in str(err.value)
    with pytest.raises(ValueError, match="unknown mixer 'softmx'"):       # a typo still gets its close matches
        vitmix.create_model("seq_lra_tiny", mixer="softmx", seq_len=16)


@pytest.mark.parametrize("mixer", [m for m in sequence_mixers() if m != "linformer"])   # linformer: fixed N
def test_a_padded_batch_with_its_mask_classifies_each_sample_as_alone(mixer):
    """float64: logits of a right-padded batch with its mask equal each sample's unpadded logits."""
    torch.manual_seed(0)
    model = vitmix.create_model("seq_lra_tiny", mixer=mixer, seq_len=16, vocab_size=16, num_classes=3,
                                drop_rate=0.0).double().eval()
    lengths = (16, 9, 5)
    ids = torch.randint(0, 16, (3, 16))
    mask = torch.tensor(lengths)[:, None] > torch.arange(16)
    with torch.no_grad():
        padded = model(ids, mask=mask)
        alone = torch.cat([model(ids[i:i + 1, :n]) for i, n in enumerate(lengths)])
        unmasked = model(ids)
    torch.testing.assert_close(padded, alone, rtol=0, atol=1e-10)
    assert not torch.allclose(unmasked[1:], alone[1:])       # without the mask, the padding is read


def test_a_bad_mask_is_a_one_line_error():
    model = SequenceClassifier(seq_len=20, vocab_size=16)
    with pytest.raises(ValueError, match="mask must be a bool tensor"):
        model(torch.zeros(2, 8, dtype=torch.long), mask=torch.ones(2, 8))
    with pytest.raises(ValueError, match="all padding"):
        model(torch.zeros(2, 8, dtype=torch.long), mask=torch.zeros(2, 8, dtype=torch.bool))


def test_bad_inputs_are_one_line_errors():
    model = SequenceClassifier(seq_len=20, vocab_size=16)
    with pytest.raises(ValueError, match=r"21 tokens is longer than the model's position table \(seq_len=20\)"):
        model(torch.zeros(1, 21, dtype=torch.long))
    with pytest.raises(ValueError, match=r"ids must lie in 0..15"):
        model(torch.full((1, 5), 16))
    with pytest.raises(ValueError, match="expected ids"):
        model(torch.zeros(1, 5, 1, dtype=torch.long))
    with pytest.raises(ValueError, match="expected integer ids"):
        model(torch.zeros(1, 5))
    with pytest.raises(ValueError, match="embed='patch'"):
        SequenceClassifier(embed="patch")
    assert model(torch.zeros(1, 7, dtype=torch.long)).shape == (1, 10)      # shorter: the table's start


def test_linear_pixel_embedding_reads_ids_as_intensities():
    model = SequenceClassifier(seq_len=16, vocab_size=256, embed="linear", drop_rate=0.0).eval()
    assert isinstance(model.tokens, torch.nn.Linear)
    bright, dark = torch.full((1, 16), 255), torch.zeros(1, 16, dtype=torch.long)
    expected = model.tokens.weight[:, 0] + model.tokens.bias + model.pos_embed[0, 0]
    torch.testing.assert_close(model.embed_ids(bright)[0, 0], expected)
    assert not torch.allclose(model(bright), model(dark))
    model.reset_classifier(4)
    assert model(dark).shape == (1, 4) and model.head[0].out_features == 128
    model.reset_classifier(0)
    assert model(dark).shape == (1, 64)                                       # the pooled features


def test_a_few_steps_lower_the_loss_on_tiny_listops(tmp_path):
    torch.manual_seed(0)
    train, _, info = build_sequence_datasets("listops", data_dir=str(tmp_path), train_size=64, val_size=1,
                                             min_len=4, max_len=24, progress=False)
    ids = torch.stack([train[i][0] for i in range(len(train))])
    labels = torch.tensor([train[i][1] for i in range(len(train))])
    model = vitmix.create_model("seq_lra_tiny", drop_rate=0.0, **info.model_kwargs())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(40):
        loss = F.cross_entropy(model(ids), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.7 * losses[0], losses          # from chance (ln 10 = 2.30)


@pytest.mark.parametrize("mixer", ["bigbird", "laplacian"])     # one run per valid length / masked in the batch
def test_a_masked_batch_compiles(mixer):
    """torch.compile of a masked forward: the per-length loop and the landmark counts read the data, so the graph
    breaks there (BigBird's loop once failed inside dynamo) and the result is the eager one."""
    torch.manual_seed(0)
    model = vitmix.create_model("seq_lra_tiny", mixer=mixer, seq_len=32, vocab_size=16, num_classes=3,
                                drop_rate=0.0).eval()
    ids = torch.randint(0, 16, (3, 32))
    mask = torch.tensor([32, 20, 7])[:, None] > torch.arange(32)
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(model)(ids, mask=mask), model(ids, mask=mask), rtol=1e-5, atol=1e-5)
