"""docs/dense.md: the torchvision-pipeline example runs as written."""
import pathlib
import re

DOC = pathlib.Path(__file__).resolve().parents[2] / "docs" / "dense.md"


def test_the_pipeline_example_runs(capsys):
    blocks = re.findall(r"```python\n(.*?)```", DOC.read_text(), flags=re.S)
    example = next(b for b in blocks if "MaskRCNN(backbone" in b)
    exec(compile(example, str(DOC), "exec"), {})
    out = capsys.readouterr().out
    assert "['boxes', 'labels', 'masks', 'scores']" in out and "mIoU" in out
