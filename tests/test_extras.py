"""Optional dependencies: matplotlib is the ``plot`` extra. A core install imports vitmix, builds models and
trains without it; whatever plots says which extra to install in one line. The missing package is forced by
``sys.modules[name] = None`` (Python then raises ImportError on import)."""
import subprocess
import sys
from pathlib import Path

import pytest

from vitmix._util import MissingExtra, pyplot
from vitmix.cli import main

ROOT = Path(__file__).parents[1]


@pytest.fixture
def no_matplotlib(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "matplotlib", None)


def test_matplotlib_is_an_extra_of_its_own():
    tomllib = pytest.importorskip("tomllib")      # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    core = {dep.split(">")[0].split("=")[0] for dep in project["dependencies"]}
    assert "matplotlib" not in core and {"torch", "timm", "safetensors", "pyyaml"} <= core
    assert project["optional-dependencies"]["plot"] == ["matplotlib"]
    assert "vitmix[plot]" in project["optional-dependencies"]["dev"]       # make test / .ci install it


def test_a_core_install_imports_builds_and_loads_the_training_code_without_matplotlib():
    code = ("import sys; sys.modules['matplotlib'] = None\n"
            "import timm, vitmix, torch\n"
            "model = vitmix.create_model('vit_nano_patch4_32', mixer='laplacian', depth=1)\n"
            "model(torch.zeros(1, 3, 32, 32))\n"
            "import vitmix.train.runner, vitmix.compare.runner, vitmix.bench.report, vitmix.analysis.heads\n"
            "import vitmix.cli\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]


def test_plotting_without_matplotlib_names_the_extra(no_matplotlib):
    with pytest.raises(MissingExtra, match=r"^the plot needs matplotlib, which is not installed: "
                                           r"pip install 'vitmix\[plot\]'$"):
        pyplot("the plot")


def test_a_run_without_matplotlib_skips_only_its_curves(no_matplotlib, tmp_path):
    from vitmix.train.plots import plot_curves

    history = [dict(epoch=1, train_loss=1.0, val_loss=1.0, train_acc=50.0, val_acc=50.0)]
    with pytest.warns(UserWarning, match=r"curves.png needs matplotlib.*vitmix\[plot\].*saved without it"):
        plot_curves(history, tmp_path / "curves.png")
    assert not (tmp_path / "curves.png").exists()


def test_a_leaderboard_without_matplotlib_keeps_its_tables(no_matplotlib, tmp_path):
    from vitmix.compare.leaderboard import write_leaderboard

    rows = [{"entry": "a", "seed": 0, "status": "ok", "top1": 50.0, "params": 1500, "train_img_per_s": 10.0,
             "history": [dict(epoch=1, train_loss=1.0, val_loss=1.0, train_acc=50.0, val_acc=50.0)]}]
    env = dict(device_name="cpu", torch_threads=1, load_average_1m=0.0, torch="x", date_utc="now")
    with pytest.warns(UserWarning, match=r"comparison's plots needs matplotlib.*written without its plots"):
        paths = write_leaderboard(rows, tmp_path, environment=env)
    assert (tmp_path / "leaderboard.md").is_file() and not any(p.suffix == ".png" for p in paths)
    assert not list(tmp_path.glob("*.png"))


def test_a_benchmark_without_matplotlib_keeps_its_results(no_matplotlib, tmp_path):
    from vitmix.bench import BenchConfig, run_sweep
    from vitmix.bench.report import write_results

    result = run_sweep(BenchConfig(kind="mixers", names=["softmax"], sizes=[16], dim=16, heads=2, passes=("fwd",),
                                   min_run_time=0.01, measure_memory=False, measure_flops=False), progress=False)
    with pytest.warns(UserWarning, match=r"benchmark report's plots needs matplotlib.*written without their plots"):
        paths = write_results(result, str(tmp_path), command="test")
    assert {Path(p).name for p in paths} == {"results.csv", "results.json", "results.md"}


def test_the_cli_prints_the_missing_extra_in_one_line(no_matplotlib, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("VITMIX_DISABLE_C_KERNEL", "1")
    code = main(["analyze", "newton", "--landmarks", "4", "--img-size", "16", "--out", str(tmp_path)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1
    assert "`vitmix analyze` needs matplotlib, which is not installed: pip install 'vitmix[plot]'" in err
