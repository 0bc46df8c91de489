"""vitmix.runs, the run machinery every task shares: which checkpoint a run directory resolves to,
--device parsing, seeded subsets, the run-directory checks, and a resume of an older state.pt."""
import pytest
import torch
from torch import nn

from vitmix.runs import (
    BEST_FIRST, EMA_FIRST, Trainable, check_resumable, parse_device, prepare_run_dir, resolve_checkpoint, resume_run,
    save_manifest, save_state, seeded_subset,
)
from vitmix.runs.directory import flag_of


def _touch(run, *names):
    run.mkdir(exist_ok=True)
    for name in names:
        (run / name).write_bytes(b"")


@pytest.mark.parametrize("prefer,present,chosen", [
    (BEST_FIRST, ("best.safetensors", "ema.safetensors", "last.safetensors"), "best.safetensors"),
    (BEST_FIRST, ("ema.safetensors", "last.safetensors"), "last.safetensors"),
    (EMA_FIRST, ("best.safetensors", "ema.safetensors", "last.safetensors"), "ema.safetensors"),
    (EMA_FIRST, ("last.safetensors",), "last.safetensors"),
])
def test_a_run_directory_resolves_to_the_first_file_of_the_precedence(tmp_path, prefer, present, chosen):
    _touch(tmp_path / "run", *present)
    assert resolve_checkpoint(tmp_path / "run", prefer) == tmp_path / "run" / chosen


def test_resolve_checkpoint_defaults_to_best_first_and_names_what_is_missing(tmp_path):
    _touch(tmp_path / "run", "best.safetensors", "last.safetensors")
    assert resolve_checkpoint(tmp_path / "run").name == "best.safetensors"
    _touch(tmp_path / "empty")
    with pytest.raises(FileNotFoundError, match="without ema.safetensors or last.safetensors"):
        resolve_checkpoint(tmp_path / "empty", EMA_FIRST)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resolve_checkpoint(tmp_path / "missing.safetensors")


@pytest.mark.parametrize("text,message", [("gpu", "is not a device name"), ("meta", "vitmix runs on cpu or cuda")])
def test_a_bad_device_is_a_one_line_error(text, message):
    with pytest.raises(ValueError, match=message):
        parse_device(text)
    assert parse_device("cpu") == torch.device("cpu")


def test_seeded_subsets_are_nested_and_checked():
    small, large = seeded_subset(100, 10, seed=3), seeded_subset(100, 40, seed=3)
    assert small.tolist() == large[:10].tolist() and seeded_subset(100, None, seed=3) is None
    with pytest.raises(ValueError, match="--fd-classifier-subset 101 must be between 1 and the 100"):
        seeded_subset(100, 101, seed=0, flag="--fd-classifier-subset")


def test_flags_are_named_as_on_the_command_line():
    assert flag_of("mixer_options") == "--mixer-option" and flag_of("max_steps") == "--max-steps"


def test_both_tasks_refuse_a_folder_of_other_files_and_a_resume_without_a_run(tmp_path):
    from vitmix.generate.config import GenerateConfig
    from vitmix.train.config import TrainConfig

    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("x")
    for config_cls in (TrainConfig, GenerateConfig):
        with pytest.raises(ValueError, match=r"non-empty directory that holds no vitmix run \(it has notes.txt\)"):
            prepare_run_dir(config_cls(out=str(tmp_path / "mine")), config_cls, ("out", "resume"), "x")
        with pytest.raises(FileNotFoundError, match="holds no run to resume"):
            check_resumable(config_cls(out=str(tmp_path / "mine"), resume=True), tmp_path / "mine", config_cls,
                            ("out", "resume"))
    assert prepare_run_dir(TrainConfig(out=str(tmp_path / "new")), TrainConfig, ("out", "resume"), "x") == \
        tmp_path / "new"


def _parts(seed):
    torch.manual_seed(seed)
    model = nn.Linear(3, 2)
    return Trainable(model, torch.optim.SGD(model.parameters(), lr=0.1))


def test_resume_restores_the_model_and_continues_the_random_stream(tmp_path):
    saved = _parts(0)
    torch.manual_seed(7)
    save_manifest(tmp_path, saved, epoch=1, step=5, history=[{"epoch": 1}], files=())
    expected = torch.rand(3)
    restored = _parts(1)
    done = resume_run(tmp_path, restored, log=pytest.fail, rewrite=pytest.fail)
    assert (done.epoch, done.step, done.history) == (1, 5, [{"epoch": 1}])
    assert torch.equal(restored.model.weight, saved.model.weight) and torch.equal(torch.rand(3), expected)


def test_resume_reads_the_bare_torch_rng_state_older_generate_runs_saved(tmp_path):
    saved = _parts(0)
    torch.manual_seed(11)
    save_state(tmp_path / "state.pt", {"model": saved.model.state_dict(), "optimizer": saved.optimizer.state_dict(),
                                       "epoch": 1, "step": 2, "history": [{"epoch": 1}], "files": {},
                                       "rng": torch.get_rng_state()})
    expected = torch.rand(3)
    done = resume_run(tmp_path, _parts(1), log=pytest.fail, rewrite=pytest.fail)
    assert done.epoch == 1 and torch.equal(torch.rand(3), expected)


def test_a_partial_set_is_reported_once_and_rewritten(tmp_path):
    parts, logged, rewritten = _parts(0), [], []
    (tmp_path / "last.safetensors").write_bytes(b"epoch 1")
    save_manifest(tmp_path, parts, epoch=1, step=1, history=[{"epoch": 1}], files=("last.safetensors",))
    (tmp_path / "last.safetensors").write_bytes(b"half of epoch 2")   # killed while writing the next set
    (tmp_path / ".last.safetensors.abc.tmp").write_bytes(b"")

    def rewrite(history):      # as a task does: the weights of the set's epoch, from the restored state
        rewritten.append(history)
        (tmp_path / "last.safetensors").write_bytes(b"epoch 1")

    resume_run(tmp_path, parts, log=logged.append, rewrite=rewrite)
    assert rewritten == [[{"epoch": 1}]] and not list(tmp_path.glob(".*.tmp"))
    assert len(logged) == 2 and "1 temporary file(s)" in logged[0] and "partial checkpoint set" in logged[1]
    assert (tmp_path / "metrics.jsonl").read_text() == '{"epoch": 1}\n'


def test_every_public_name_is_the_function_not_a_submodule_of_the_same_name():
    """Regression: ``resume`` named both a function and ``vitmix.runs.resume``, and once the submodule
    was imported ``from vitmix.runs import resume`` gave the module."""
    import importlib
    import types

    import vitmix.runs as runs

    for module in ("checkpoints", "device", "directory", "flags", "resume"):
        importlib.import_module(f"vitmix.runs.{module}")
    assert not [name for name in runs.__all__ if isinstance(getattr(runs, name), types.ModuleType)]
