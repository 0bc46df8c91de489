"""bench.timing: the start-up notice filter."""
import subprocess
import sys


def test_timing_import_drops_only_the_no_cuda_notice():
    """Importing torch.utils.benchmark logs "No CUDA runtime is found" on CPU machines; vitmix drops
    that one record (it made every one-line CLI error two lines) and nothing else."""
    code = ("import logging, vitmix.bench.timing\n"
            "log = logging.getLogger('torch.utils.cpp_extension')\n"
            "log.warning('No CUDA runtime is found, using CUDA_HOME=/x')\n"
            "log.warning('a real compiler problem')\n")
    err = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stderr
    assert "No CUDA runtime" not in err
    assert "a real compiler problem" in err
