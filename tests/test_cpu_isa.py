"""The CPU kernels' ISA: chosen from the CPU's features, forced by RADIXFLOW_CPU_ISA, named in
the log; every ISA this machine runs passes the kernel tests; `dtype=auto` from the bf16 table."""

from __future__ import annotations

import ctypes
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from tiny_models import make_tiny_model_dir

import radixflow as rf
from radixflow.kernels import cpu_build
from radixflow.kernels.cpu_build import choose_isa, fast_bf16
from radixflow.runtime import model_runner
from radixflow.runtime.layers.target import OpsTarget

# /proc/cpuinfo flags (the parts that matter) of the CPUs users run.
ZEN3 = {"sse4_2", "avx", "avx2", "fma", "f16c", "bmi2"}
XEON_AVX512_BF16 = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_bf16"}
SAPPHIRE_RAPIDS = XEON_AVX512_BF16 | {"avx512_vnni", "amx_tile", "amx_bf16", "amx_int8"}
SKYLAKE_X = ZEN3 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd"}
GRAVITON2 = {"fp", "asimd", "crc32", "atomics", "asimddp"}
GRAVITON3 = GRAVITON2 | {"sve", "bf16", "i8mm"}
OLD_X86 = {"sse4_2", "avx"}


def test_best_isa_per_cpu():
    assert choose_isa("x86_64", ZEN3, None).isa.name == "avx2"
    assert choose_isa("x86_64", SKYLAKE_X, None).isa.name == "avx512"
    assert choose_isa("aarch64", GRAVITON2, None).isa.name == "neon"
    assert choose_isa("aarch64", set(), "auto").isa.name == "neon"  # macOS: no /proc/cpuinfo
    off = choose_isa("x86_64", OLD_X86, None)
    assert off.isa is None and "avx2" in off.reason and "runs none" in off.reason


def test_flags_are_explicit_per_isa_with_extensions_where_the_cpu_has_them():
    avx2 = choose_isa("x86_64", SAPPHIRE_RAPIDS, "avx2")
    assert (
        avx2.flags == ("-mavx2", "-mfma", "-mf16c") and avx2.reason == "forced by RADIXFLOW_CPU_ISA"
    )
    assert "-mavx512bf16" in choose_isa("x86_64", XEON_AVX512_BF16, None).flags
    assert "-mavx512bf16" not in choose_isa("x86_64", SKYLAKE_X, None).flags
    assert "-mavx512vnni" in choose_isa("x86_64", SAPPHIRE_RAPIDS, None).flags
    assert {"-mamx-tile", "-mamx-int8"} <= set(choose_isa("x86_64", SAPPHIRE_RAPIDS, None).flags)
    assert "-mamx-int8" not in choose_isa("x86_64", XEON_AVX512_BF16, None).flags
    assert not any("march" in flag for flag in choose_isa("x86_64", SAPPHIRE_RAPIDS, None).flags)
    assert choose_isa("aarch64", GRAVITON3, None).flags == ("-march=armv8.2-a+dotprod",)
    assert choose_isa("aarch64", {"fp", "asimd"}, None).flags == ()  # a Cortex-A72


def test_forced_isa_the_cpu_cannot_run_falls_back_with_the_reason():
    choice = choose_isa("x86_64", ZEN3, "avx512")
    assert choice.isa.name == "avx2" and choice.fell_back
    assert "lacks avx512bw, avx512dq, avx512f, avx512vl" in choice.reason
    assert "using avx2" in choice.reason
    neon_on_x86 = choose_isa("x86_64", ZEN3, "neon")
    assert neon_on_x86.isa.name == "avx2" and "lacks aarch64" in neon_on_x86.reason
    nothing = choose_isa("x86_64", OLD_X86, "avx2")
    assert nothing.isa is None and "lacks avx2, f16c, fma" in nothing.reason


def test_none_turns_the_kernels_off_and_an_unknown_name_is_an_error():
    assert choose_isa("x86_64", SAPPHIRE_RAPIDS, "none").isa is None
    with pytest.raises(
        ValueError, match="RADIXFLOW_CPU_ISA='sse9' is not one of auto, none, avx512"
    ):
        choose_isa("x86_64", SAPPHIRE_RAPIDS, "sse9")


def test_a_cpu_without_avx512_gets_the_avx2_library(monkeypatch):
    monkeypatch.setattr(cpu_build, "cpu_arch", lambda: "x86_64")
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: set(ZEN3))
    monkeypatch.delenv("RADIXFLOW_CPU_ISA", raising=False)
    choice = cpu_build.current_choice()
    assert choice.isa.name == "avx2"
    assert cpu_build.build_folder(Path("/x"), choice).name.startswith("kernels-avx2-")


def test_each_isa_builds_into_its_own_folder():
    folders = {
        cpu_build.build_folder(Path("/x"), choose_isa("x86_64", SAPPHIRE_RAPIDS, name))
        for name in ("avx512", "avx2")
    }
    assert len(folders) == 2


def test_describe_names_the_isa_or_why_the_kernels_are_off():
    assert cpu_build.Loaded("avx512", ("-mavx512f", "-mavx512bf16"), "").describe() == "avx512+bf16"
    assert cpu_build.Loaded("avx2", ("-mavx2",), "").describe() == "avx2"
    amx = cpu_build.Loaded("avx512", ("-mavx512f", "-mavx512vnni", *cpu_build.AMX_FLAGS), "")
    assert amx.describe() == "avx512+vnni+amx_tile+amx_int8"
    assert cpu_build.Loaded("neon", ("-march=armv8.2-a+dotprod",), "").describe() == "neon+asimddp"
    assert cpu_build.Loaded(None, (), "RADIXFLOW_CPU_ISA=none").describe() == (
        "off (RADIXFLOW_CPU_ISA=none)"
    )


def test_features_named_in_radixflow_cpu_without_are_left_out_of_the_build(monkeypatch):
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: set(SAPPHIRE_RAPIDS))
    monkeypatch.setattr(cpu_build, "cpu_arch", lambda: "x86_64")
    monkeypatch.delenv("RADIXFLOW_CPU_ISA", raising=False)
    assert "-mamx-int8" in cpu_build.current_choice().flags
    monkeypatch.setenv("RADIXFLOW_CPU_WITHOUT", "amx_int8, avx512_vnni")
    flags = cpu_build.current_choice().flags
    assert "-mamx-int8" not in flags and "-mavx512vnni" not in flags and "-mamx-tile" in flags
    monkeypatch.setenv("RADIXFLOW_CPU_WITHOUT", "avx512f")
    assert cpu_build.current_choice().isa.name == "avx2"


def test_amx_refused_by_linux_is_dropped_from_the_flags_with_a_warning(monkeypatch):
    flags = ("-mavx512f", "-mavx512vnni", *cpu_build.AMX_FLAGS)
    monkeypatch.setattr(cpu_build, "amx_granted", lambda: False)
    with pytest.warns(RuntimeWarning, match="refused this process the tile state"):
        assert cpu_build._granted(flags) == ("-mavx512f", "-mavx512vnni")
    monkeypatch.setattr(cpu_build, "amx_granted", lambda: True)
    assert cpu_build._granted(flags) == flags
    # built with the tile flag only (RADIXFLOW_CPU_WITHOUT=amx_int8): no tiles, no warning
    assert cpu_build._granted(("-mavx512f", "-mamx-tile")) == ("-mavx512f",)


def _tile_state_granted() -> bool:
    """Whether Linux has granted this process AMX's tile data (arch_prctl ARCH_GET_XCOMP_PERM,
    bit 18: XFEATURE_XTILEDATA)."""
    permitted = ctypes.c_uint64(0)
    libc = ctypes.CDLL(None, use_errno=True)
    sys_arch_prctl, get_permission = 158, 0x1022
    return libc.syscall(sys_arch_prctl, get_permission, ctypes.byref(permitted)) == 0 and bool(
        permitted.value >> 18 & 1
    )


@pytest.mark.skipif(not cpu_build.cpu_kernels_available(), reason="no CPU kernels here")
def test_the_int8_matmul_runs_on_amx_tiles_where_the_cpu_has_them():
    """A CPU reporting AMX-TILE and AMX-INT8 runs the int8-activation matmul on tiles once
    Linux grants the tile state (tests/test_kernels_quant.py checks its bits against the vector
    kernel's), and the log line names them; elsewhere the library says it does not."""
    granted = cpu_build.amx_granted()
    assert granted == ("amx_int8" in cpu_build.loaded().describe())
    if not (
        {"amx_tile", "amx_int8"} <= cpu_build.cpu_flags() and cpu_build.loaded().isa == "avx512"
    ):
        assert not granted
        pytest.skip("this CPU has no AMX-INT8 (the int8 matmul runs on its vector kernels)")
    assert granted == _tile_state_granted()


@pytest.mark.skipif(not cpu_build.cpu_kernels_available(), reason="no CPU kernels here")
def test_the_ops_log_line_names_the_loaded_isa():
    described = OpsTarget(torch.device("cpu"), torch.float32).describe()
    assert described == f"cpu float32, CPU kernels {cpu_build.loaded().describe()}"
    assert (
        "off (they take float32 and bfloat16)"
        in OpsTarget(torch.device("cpu"), torch.float16).describe()
    )


@pytest.mark.skipif(not cpu_build.cpu_kernels_available(), reason="no CPU kernels here")
def test_the_engine_startup_log_names_the_isa(tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="radixflow")
    with rf.Engine(str(make_tiny_model_dir(tmp_path)), dtype="float32", max_total_tokens=64):
        pass
    lines = [record.getMessage() for record in caplog.records]
    isa = f"CPU kernels {cpu_build.loaded().describe()}"
    summary = next(line for line in lines if line.startswith("model "))
    assert "rms_norm=cpu rotary=cpu" in summary and isa in summary
    assert any(line.startswith("ops for cpu float32, ") and isa in line for line in lines)


def test_fast_bf16_table():
    assert fast_bf16("x86_64", XEON_AVX512_BF16) and fast_bf16("x86_64", SAPPHIRE_RAPIDS)
    assert not fast_bf16("x86_64", ZEN3) and not fast_bf16("x86_64", SKYLAKE_X)
    assert fast_bf16("aarch64", GRAVITON3) and not fast_bf16("aarch64", GRAVITON2)


@pytest.mark.parametrize("flags,dtype", [(ZEN3, torch.float32), (SAPPHIRE_RAPIDS, torch.bfloat16)])
def test_dtype_auto_on_the_cpu_follows_the_table(monkeypatch, flags, dtype):
    monkeypatch.setattr(cpu_build, "cpu_arch", lambda: "x86_64")
    monkeypatch.setattr(cpu_build, "cpu_flags", lambda: set(flags))
    assert model_runner.resolve_dtype("auto", torch.device("cpu")) == dtype
    assert model_runner.resolve_dtype("float32", torch.device("cpu")) == torch.float32
    # packed weights: the quantized kernels sum in float32 whatever the activations
    assert model_runner.resolve_dtype("auto", torch.device("cpu"), True) == torch.float32


KERNEL_TESTS = [
    "tests/test_kernels_cpu_attention.py",
    "tests/test_kernels_cpu_elementwise.py",
    "tests/test_kernels_cpu_linear.py",
    "tests/test_kernels_quant.py",
    "tests/test_decode_layer.py",
]


def run_kernel_tests(command: list[str], env: dict[str, str]) -> None:
    """`python <command> <pytest args> KERNEL_TESTS` in a child process: all pass, none skip."""
    done = subprocess.run(
        [sys.executable, *command, "-q", "-x", "-p", "no:cacheprovider", *KERNEL_TESTS],
        cwd=Path(__file__).resolve().parent.parent,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert done.returncode == 0, done.stdout[-3000:]
    assert " passed" in done.stdout and " skipped" not in done.stdout.splitlines()[-1]


@pytest.mark.slow
@pytest.mark.parametrize("isa", cpu_build.runnable_isas()[1:] or [None])
def test_kernel_tests_pass_on_every_lower_isa_this_cpu_runs(isa):
    """The best ISA runs the kernel tests in this process; each lower one (the library built
    with that ISA's flags only) runs them again in a child process."""
    if isa is None:
        pytest.skip("this CPU runs one kernel ISA only")
    env = {**os.environ, "RADIXFLOW_CPU_ISA": isa}
    check = "from radixflow.kernels import cpu_build; print(cpu_build.loaded().isa)"
    loaded = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=900
    )
    assert loaded.stdout.strip() == isa, loaded.stderr[-2000:]
    run_kernel_tests(["-m", "pytest"], env)


@pytest.mark.slow
def test_kernel_tests_pass_without_the_optional_extensions_this_cpu_has():
    """The best ISA built without the extensions it takes where a CPU has them (AVX512-VNNI and
    -BF16, AMX, Arm's SDOT; `RADIXFLOW_CPU_WITHOUT`): the other code paths of the int8 dot
    products, which CPUs without them (Skylake-X, Ice Lake, older Arm cores) run, pass the
    kernel tests in a child process."""
    choice = cpu_build.current_choice()
    flags = cpu_build.cpu_flags()
    present = {
        feature for feature, _ in (choice.isa.extras if choice.isa else ()) if feature in flags
    }
    if not present:
        pytest.skip("this CPU has none of its kernel ISA's optional extensions")
    env = {**os.environ, "RADIXFLOW_CPU_WITHOUT": ",".join(sorted(present))}
    env.pop("RADIXFLOW_CPU_ISA", None)
    check = "from radixflow.kernels import cpu_build; print(cpu_build.loaded().describe())"
    loaded = subprocess.run(
        [sys.executable, "-c", check], env=env, capture_output=True, text=True, timeout=900
    )
    assert loaded.stdout.strip() == choice.isa.name, loaded.stderr[-2000:]
    run_kernel_tests(["-m", "pytest"], env)


def test_a_mac_reports_its_arm_features_through_sysctl(monkeypatch):
    answers = {"hw.optional.arm.FEAT_DotProd": "1\n", "hw.optional.arm.FEAT_BF16": "0\n"}
    monkeypatch.setattr(cpu_build.platform, "system", lambda: "Darwin")
    monkeypatch.setattr(
        cpu_build.subprocess,
        "run",
        lambda args, **kw: subprocess.CompletedProcess(args, 0, answers[args[-1]], ""),
    )
    assert cpu_build.macos_arm_flags() == {"asimddp"}
    assert choose_isa("aarch64", cpu_build.macos_arm_flags(), None).flags == (
        "-march=armv8.2-a+dotprod",
    )
    monkeypatch.setattr(cpu_build.platform, "system", lambda: "Linux")
    assert cpu_build.macos_arm_flags() == set()
