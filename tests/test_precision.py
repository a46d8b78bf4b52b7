"""`training.bf16: auto` trains in bfloat16 where the CPU or GPU computes it natively and in float32 elsewhere, and
says which and why; `true` without native bfloat16 warns what it costs. The capability check is faked here, so every
branch runs on any CPU."""

import logging

import pytest
import torch

import vaswani_mt.precision as precision
from vaswani_mt.precision import Bf16Choice, choose_bf16, cpu_bf16_flags, native_bf16
from vaswani_mt.recipe.config import RunConfig, load_run_config
from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

AVX2_ONLY = "flags\t\t: fpu sse sse2 avx avx2 fma\n"
ZEN4 = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"


@pytest.fixture
def cpu_with(monkeypatch, tmp_path):
    """Make the CPU look like one whose /proc/cpuinfo flags line is `flags`."""

    def fake(flags: str):
        cpuinfo = tmp_path / "cpuinfo"
        cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n" + flags)
        monkeypatch.setattr(precision, "cpu_bf16_flags", lambda: cpu_bf16_flags(cpuinfo))

    return fake


@pytest.mark.parametrize("flags,expected", [(AVX2_ONLY, []), (ZEN4, ["avx512_bf16"]),
                                            (SAPPHIRE_RAPIDS, ["avx512_bf16", "amx_bf16"])])
def test_the_cpus_native_bfloat16_is_read_from_its_flags(tmp_path, flags, expected):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text(flags)
    assert cpu_bf16_flags(cpuinfo) == expected


def test_auto_is_bfloat16_on_a_cpu_with_native_bfloat16_and_says_why(cpu_with):
    cpu_with(ZEN4)
    choice = choose_bf16("auto", "cpu")
    assert choice.enabled
    assert choice.describe() == ("bfloat16 autocast (training.bf16 is auto: the CPU multiplies bfloat16 natively "
                                 "(avx512_bf16))")


def test_auto_is_float32_on_a_cpu_without_native_bfloat16_without_a_warning(cpu_with, caplog):
    cpu_with(AVX2_ONLY)
    with caplog.at_level(logging.WARNING):
        choice = choose_bf16("auto", "cpu")
    assert not choice.enabled
    assert "no native bfloat16" in choice.reason and "13x slower" in choice.reason
    assert not caplog.records


def test_true_on_a_cpu_without_native_bfloat16_is_kept_with_one_warning_of_its_cost(cpu_with, caplog):
    cpu_with(AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.precision"):
        choice = choose_bf16(True, "cpu")
    assert choice.enabled
    [warning] = caplog.records
    assert "13x slower" in warning.getMessage() and "auto would train in float32" in warning.getMessage()
    assert "\n" not in warning.getMessage()


def test_true_on_a_native_cpu_and_false_anywhere_say_only_the_setting(cpu_with, caplog):
    cpu_with(SAPPHIRE_RAPIDS)
    with caplog.at_level(logging.WARNING):
        assert choose_bf16(True, "cpu") == Bf16Choice(True, "training.bf16 is true")
        assert choose_bf16(False, "cpu") == Bf16Choice(False, "training.bf16 is false")
    assert not caplog.records


@pytest.mark.parametrize("supported", [True, False])
def test_auto_on_cuda_follows_the_devices_bfloat16_support(monkeypatch, supported):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "Some GPU")
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: supported)
    assert choose_bf16("auto", "cuda").enabled is supported
    assert native_bf16("cuda")[1] == ("Some GPU supports bfloat16" if supported else "Some GPU has no bfloat16")


def test_an_unknown_bf16_setting_is_refused_by_name(tmp_path):
    path = tmp_path / "run.yaml"
    path.write_text("extends: multi30k-en-de\ntraining:\n  bf16: sometimes\n")
    with pytest.raises(ValueError, match="training.bf16 must be true, false or auto, got 'sometimes'"):
        load_run_config(path)


@pytest.mark.parametrize("flags,expected", [(AVX2_ONLY, False), (ZEN4, True)])
def test_the_trainer_arguments_of_an_auto_config_use_bfloat16_where_native(cpu_with, flags, expected):
    cpu_with(flags)
    training = RunConfig().training
    training.bf16 = "auto"
    assert VaswaniTrainingArguments.from_config(training, "out", use_cpu=True, report_to=[]).bf16 is expected


def test_the_shipped_configs_choose_bfloat16_by_the_machine():
    for name in ("multi30k-en-de", "multi30k-de-en", "multi30k-en-de-lctok-cpu", "tatoeba-en-hi", "wmt14-en-de-base"):
        assert load_run_config(name).training.bf16 == "auto", name
