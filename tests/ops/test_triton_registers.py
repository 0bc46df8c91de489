"""The kernel-matrix and Newton–Schulz Triton kernels, compiled for sm_90 (H100) without a GPU at the
launch configurations the ops use (m = 49 and 128 landmarks, head dim 64): ``ptxas`` must report no
register spills (``docs/gpu.md``; the earlier Newton–Schulz kernel spilled a 7.5 KB stack per thread).

The interpreter (which ``tests/conftest.py`` turns on) replaces Triton's compiler front end in this
process, so the compilation runs in a subprocess with ``TRITON_INTERPRET=0``."""
import os
import re
import subprocess
import sys
import textwrap

import pytest

triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'vitmix[gpu]')")

PTXAS = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")

SCRIPT = textwrap.dedent('''
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource
    from vitmix.ops.kernel import triton as kt
    from vitmix.ops.newton import triton as nt

    def compile_for_sm90(label, fn, signature, constexprs, num_warps):
        print(f"== {label}", flush=True)          # ptxas's log (TRITON_DUMP_PTXAS_LOG) follows
        src = ASTSource(fn=fn, signature=signature, constexprs=constexprs)
        triton.compile(src, target=GPUTarget("cuda", 90, 32), options={"num_warps": num_warps})

    def ints(names):
        return {n: "i32" for n in names.split()}

    fwd = {"x_ptr": "*bf16", "yt_ptr": "*fp32", "out_ptr": "*fp32", **ints("H N M D MPAD sxb sxh sxn sxd"),
           "scale": "fp32", "L1": "constexpr", "BLOCK_N": "constexpr", "BLOCK_M": "constexpr"}
    grad = {"a_ptr": "*bf16", "b_ptr": "*bf16", "g_ptr": "*fp32", "o_ptr": "*fp32", "part_ptr": "*fp32",
            **ints("H NA NB D SPLITS CHUNK sab sah san sad sbb sbh sbn sbd sgb sgh sga sgo sob soh soa soo"),
            "coef": "fp32", "L1": "constexpr", "BLOCK_A": "constexpr", "BLOCK_D": "constexpr"}
    token_grad = {"x_ptr": "*bf16", "yf_ptr": "*fp32", "g_ptr": "*fp32", "o_ptr": "*fp32", "out_ptr": "*bf16",
                  **ints("H N M D DPAD sxb sxh sxn sxd sgb sgh sgn sgm sob soh son som"), "coef": "fp32",
                  "L1": "constexpr", "BLOCK_N": "constexpr", "BLOCK_D": "constexpr"}
    ns = {"p_ptr": "*fp32", "work_ptr": "*fp32", **ints("M ITERS"), "MP": "constexpr", "BR": "constexpr"}
    for m in (7, 49):
        compile_for_sm90(f"forward m={m}", kt._forward_kernel(), fwd, {"L1": True, **kt._forward_blocks(16384, m)},
                         kt._FWD_WARPS)
    compile_for_sm90("token gradient d=64", kt._token_grad_kernel(), token_grad,
                     {"L1": True, **kt._token_grad_blocks(16384, 64)}, kt._GRAD_WARPS)
    compile_for_sm90("landmark gradient m=49", kt._grad_kernel(), grad, {"L1": False, **kt._grad_blocks(49, 64)},
                     kt._GRAD_WARPS)
    for m in (49, 128):
        compile_for_sm90(f"newton m={m}", nt._kernel(), ns, nt.blocks(m), nt._NUM_WARPS)
''')


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists(PTXAS), reason=f"triton's ptxas is not at {PTXAS}")
def test_kernels_compile_for_sm90_without_register_spills(tmp_path):
    env = dict(os.environ, TRITON_INTERPRET="0", TRITON_DUMP_PTXAS_LOG="1", TRITON_CACHE_DIR=str(tmp_path))
    run = subprocess.run([sys.executable, "-c", SCRIPT], env=env, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    sections = run.stdout.split("== ")[1:]
    assert len(sections) == 6, run.stdout[-3000:]
    for section in sections:
        label = section.splitlines()[0]
        spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", section)
        assert spills, f"{label}: no ptxas report\n{section}"
        assert spills.groups() == ("0", "0"), f"{label} spills registers: {spills.group(0)}"
