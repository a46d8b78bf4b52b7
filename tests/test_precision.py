"""`training.precision: auto` trains in the precision that pays on the device and says which and why, in facts of
the device at hand and no speed figure; bf16, fp16 and fp32 are kept (one warning where they do not pay, one line
where the device cannot); the older keys `training.bf16` and `training.fp16` still load. The devices are faked here
(/proc/cpuinfo, CUDA's capability, Apple's MPS), so every branch runs on any CPU."""

import logging
import re

import pytest
import torch

import vaswani_mt.precision as precision
from vaswani_mt.precision import PrecisionChoice, PrecisionError, choose_precision, cpu_kind, default_device
from vaswani_mt.recipe.config import ConfigError, RunConfig, load_run_config
from vaswani_mt.recipe.trainer import VaswaniTrainingArguments

AVX2_ONLY = "flags\t\t: fpu sse sse2 avx avx2 fma\n"
AVX512_WITHOUT_BF16 = "flags\t\t: fpu sse2 avx2 avx512f avx512dq avx512_vnni\n"  # the Intel Xeon of issue #51
ZEN4 = "flags\t\t: fpu sse2 avx2 avx512f avx512_bf16 avx512_vnni\n"
SAPPHIRE_RAPIDS = "flags\t\t: fpu avx2 avx512f avx512_bf16 amx_bf16 amx_tile amx_int8\n"
NEOVERSE_V1 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid sve bf16 i8mm\n"
NEOVERSE_N1 = "Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm\n"


@pytest.fixture
def cpu_with(monkeypatch, tmp_path):
    """Make the CPU look like one whose /proc/cpuinfo holds `line` (None: no readable /proc/cpuinfo)."""

    def fake(line: str | None):
        cpuinfo = tmp_path / "cpuinfo"
        if line is not None:
            cpuinfo.write_text("processor\t: 0\nmodel name\t: Some CPU\n" + line + "\nprocessor\t: 1\n" + line)
        monkeypatch.setattr(precision, "CPUINFO", cpuinfo)

    return fake


@pytest.fixture
def gpu_of_capability(monkeypatch):
    """Make CUDA look available with one GPU of compute capability (major, minor); native bfloat16 from 8.0."""

    def fake(major: int, minor: int, name: str = "Some GPU"):
        monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
        monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: name)
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda *a: (major, minor))
        monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: major >= 8)

    return fake


@pytest.fixture
def mac(monkeypatch):
    """Make this a Mac whose GPU torch can use (MPS), no CUDA; returns a function to set torch's and macOS' version."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)

    def versions(torch_version: str = "2.13.0", macos: tuple[int, int] = (15, 0)):
        monkeypatch.setattr(torch, "__version__", torch_version)
        monkeypatch.setattr(torch.backends.mps, "is_macos_or_newer", lambda major, minor: macos >= (major, minor))

    versions()
    return versions


# -- the CPU's kind, from /proc/cpuinfo ------------------------------------------------------------------------------

# A speed figure ("1.4x", "13×", "2,700 tok/s"): what the log line, metrics.json and the model card must not carry,
# since one measured on another machine does not hold for the one at hand.
SPEED_FIGURE = re.compile(r"\d[\d,.]*\s*(x|×)(?![a-z])|tok(ens)?/s", re.IGNORECASE)


@pytest.mark.parametrize("line,native,says", [
    (SAPPHIRE_RAPIDS, True, "multiplies bfloat16 natively (avx512_bf16, amx_bf16)"),
    (ZEN4, True, "multiplies bfloat16 natively (avx512_bf16)"),
    (AVX512_WITHOUT_BF16, False, "has AVX-512 but no native bfloat16 (no avx512_bf16 or amx_bf16)"),
    (AVX2_ONLY, False, "has no native bfloat16 (AVX2 or older: no avx512f, avx512_bf16 or amx_bf16)"),
    (NEOVERSE_V1, True, "multiplies bfloat16 natively (bf16 in its Features)"),
    (NEOVERSE_N1, False, "has no native bfloat16 (no bf16 in its Features)"),
], ids=["x86-amx", "x86-avx512-bf16", "x86-avx512-without-bf16", "x86-avx2", "aarch64-bf16", "aarch64-without"])
def test_the_cpus_kind_is_read_from_its_cpuinfo_and_said_in_its_flags(cpu_with, line, native, says):
    cpu_with(line)
    kind = cpu_kind()
    assert kind.native is native
    assert kind.reason() == f"the CPU {says}"


@pytest.mark.parametrize("torch_says", [True, False])
def test_without_a_readable_cpuinfo_torchs_own_check_decides(cpu_with, monkeypatch,
                                                                                     torch_says):
    cpu_with(None)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: torch_says, raising=False)
    kind = cpu_kind()
    assert kind.native is torch_says
    assert kind.reason() == ("the CPU multiplies bfloat16 natively (torch's check: AVX512-BF16)" if torch_says else
                             "the CPU has no native bfloat16 that torch knows of")


def test_a_cpuinfo_with_neither_flags_nor_features_falls_back_to_torchs_check(cpu_with, monkeypatch):
    cpu_with("vendor_id\t: SomeVendor")
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    assert not cpu_kind().native


# -- auto: the precision that pays ---------------------------------------------------------------------------------

@pytest.mark.parametrize("line,expected", [(SAPPHIRE_RAPIDS, "bf16"), (NEOVERSE_V1, "bf16"),
                                           (AVX512_WITHOUT_BF16, "fp32"), (AVX2_ONLY, "fp32"), (NEOVERSE_N1, "fp32")])
def test_auto_on_a_cpu_is_bfloat16_where_native_and_float32_elsewhere_without_a_warning(cpu_with, caplog, line,
                                                                                          expected):
    cpu_with(line)
    with caplog.at_level(logging.WARNING):
        choice = choose_precision("auto", "cpu")
    assert choice.name == expected
    assert choice.reason == f"training.precision is auto: {cpu_kind().reason()}"
    assert not caplog.records


@pytest.mark.parametrize("line", [SAPPHIRE_RAPIDS, ZEN4, AVX512_WITHOUT_BF16, AVX2_ONLY, NEOVERSE_V1, NEOVERSE_N1,
                                  None])
@pytest.mark.parametrize("setting", ["auto", "bf16", "fp32"])
def test_what_the_log_line_record_and_card_say_of_the_precision_carries_no_speed_figure(cpu_with, monkeypatch,
                                                                                          line, setting):
    """`describe()` is the log line, `reason` goes into metrics.json and the model card."""
    cpu_with(line)
    monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False, raising=False)
    choice = choose_precision(setting, "cpu")
    assert not SPEED_FIGURE.search(choice.describe()), choice.describe()
    assert choice.reason.startswith(f"training.precision is {setting}")


def test_the_precision_line_names_the_cpus_own_flags(cpu_with):
    cpu_with(AVX512_WITHOUT_BF16)
    assert choose_precision("auto", "cpu").describe() == (
        "float32 (training.precision is auto: the CPU has AVX-512 but no native bfloat16 (no avx512_bf16 or amx_bf16))")


@pytest.mark.parametrize("capability,expected,why", [
    ((7, 5), "fp16", "Tesla T4 has no native bfloat16 (compute capability 7.5), but fast float16"),
    ((7, 0), "fp16", "Tesla T4 has no native bfloat16 (compute capability 7.0), but fast float16"),
    ((6, 0), "fp16", "Tesla T4 has no native bfloat16 (compute capability 6.0), but fast float16"),
    ((6, 1), "fp32", "Tesla T4 has no native bfloat16 and no fast float16 (compute capability 6.1)"),
    ((8, 0), "bf16", "Tesla T4 computes bfloat16 natively"),
    ((9, 0), "bf16", "Tesla T4 computes bfloat16 natively"),
])
def test_auto_on_cuda_is_bfloat16_from_ampere_and_float16_on_older_gpus_with_fast_float16(gpu_of_capability,
                                                                                       capability, expected, why):
    gpu_of_capability(*capability, name="Tesla T4")
    assert choose_precision("auto", "cuda") == PrecisionChoice(expected, f"training.precision is auto: {why}")


def test_auto_on_apples_gpu_is_float32_and_says_why(mac):
    assert choose_precision("auto", "mps") == PrecisionChoice(
        "fp32", "training.precision is auto: Apple's GPU (MPS): neither half precision was measured to pay there "
                "(training.precision fp16 or bf16 asks for one)")


def test_the_trainer_flags_of_each_precision_are_transformers_bf16_and_fp16():
    assert PrecisionChoice("bf16", "").trainer_flags() == {"bf16": True, "fp16": False}
    assert PrecisionChoice("fp16", "").trainer_flags() == {"bf16": False, "fp16": True}
    assert PrecisionChoice("fp32", "").trainer_flags() == {"bf16": False, "fp16": False}
    assert PrecisionChoice("fp16", "why").describe() == "float16 autocast with dynamic loss scaling (why)"


# -- bf16, fp16, fp32 asked for --------------------------------------------------------------------------------------

def test_bf16_on_a_cpu_without_native_bfloat16_is_kept_with_one_warning_that_points_to_the_figures(cpu_with, caplog):
    cpu_with(AVX2_ONLY)
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.precision"):
        choice = choose_precision("bf16", "cpu")
    assert choice.name == "bf16" and choice.reason.startswith("training.precision is bf16, although the CPU has no")
    [warning] = caplog.records
    message = warning.getMessage()
    assert "auto would choose otherwise" in message and "slower than float32" in message
    assert "docs/training.md" in message and not SPEED_FIGURE.search(message)  # the figures, with their CPUs
    assert "\n" not in message


def test_bf16_on_a_native_cpu_and_fp32_anywhere_say_only_the_setting(cpu_with, caplog):
    cpu_with(SAPPHIRE_RAPIDS)
    with caplog.at_level(logging.WARNING):
        assert choose_precision("bf16", "cpu") == PrecisionChoice("bf16", "training.precision is bf16")
        assert choose_precision("fp32", "cpu") == PrecisionChoice("fp32", "training.precision is fp32")
    assert not caplog.records


def test_fp16_on_a_gpu_is_kept_silently_and_on_a_cpu_with_one_warning(gpu_of_capability, caplog):
    gpu_of_capability(8, 0)
    with caplog.at_level(logging.WARNING):
        assert choose_precision("fp16", "cuda") == PrecisionChoice("fp16", "training.precision is fp16")
    assert not caplog.records
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.precision"):
        assert choose_precision("fp16", "cpu").name == "fp16"
    [warning] = caplog.records
    assert "pays on GPUs" in warning.getMessage()


def test_fp16_on_apples_gpu_needs_torch_2_8_for_its_grad_scaler(mac):
    assert choose_precision("fp16", "mps").name == "fp16"
    mac(torch_version="2.7.1")
    with pytest.raises(PrecisionError, match=r"^training.precision fp16 on Apple's GPU \(MPS\) needs torch 2.8 or "
                                             r"later for float16 \(its GradScaler\); this is torch 2.7.1$"):
        choose_precision("fp16", "mps")


def test_bf16_on_apples_gpu_needs_macos_14_and_torch_2_6(mac):
    assert choose_precision("bf16", "mps").name == "bf16"
    mac(macos=(13, 6))
    with pytest.raises(PrecisionError, match=r"^training.precision bf16 on Apple's GPU \(MPS\) needs macOS 14 or "
                                             r"later; this is macOS"):
        choose_precision("bf16", "mps")
    mac(torch_version="2.5.1")
    with pytest.raises(PrecisionError, match="needs torch 2.6 or later for bfloat16 autocast; this is torch 2.5.1"):
        choose_precision("bf16", "mps")


# -- the device ------------------------------------------------------------------------------------------------------

def test_train_translate_and_the_demo_default_to_cuda_else_apples_gpu_else_the_cpu(monkeypatch, mac):
    assert default_device() == "mps"
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert default_device() == "cpu"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert default_device() == "cuda"


# -- the config ------------------------------------------------------------------------------------------------------

def test_the_shipped_configs_choose_the_precision_by_the_machine():
    for name in ("multi30k-en-de", "multi30k-de-en", "multi30k-en-de-lctok-cpu", "tatoeba-en-hi", "wmt14-en-de-base"):
        assert load_run_config(name, {"data.path": "."}).training.precision == "auto", name


def _training(tmp_path, text: str, overrides: dict | None = None):
    path = tmp_path / "run.yaml"
    path.write_text("extends: multi30k-en-de\ndata:\n  path: .\n" + text)
    return load_run_config(str(path), overrides).training


@pytest.mark.parametrize("keys,expected", [
    ("training:\n  bf16: auto\n", "auto"),
    ("training:\n  bf16: true\n", "bf16"),
    ("training:\n  bf16: false\n", "fp32"),
    ("training:\n  fp16: true\n", "fp16"),
    ("training:\n  bf16: false\n  fp16: true\n", "fp16"),
    ("training:\n  bf16: auto\n  fp16: true\n", "fp16"),
    ("training:\n  fp16: false\n", "auto"),  # says nothing: the shipped config's auto stays
    ("training:\n  precision: fp16\n  bf16: false\n", "fp16"),
    ("training:\n  precision: bf16\n  bf16: true\n", "bf16"),
])
def test_the_older_bf16_and_transformers_fp16_keys_load_as_the_precision_they_mean(tmp_path, keys, expected):
    assert _training(tmp_path, keys).precision == expected


def test_a_saved_config_yaml_of_an_older_run_loads_and_its_resume_compares_equal(tmp_path):
    from vaswani_mt.recipe.resuming import _what_trains

    older = tmp_path / "config.yaml"
    saved = load_run_config("multi30k-en-de", {"data.path": "."}).to_dict()
    del saved["training"]["precision"]
    saved["training"]["bf16"] = "auto"
    older.write_text(__import__("yaml").safe_dump(saved))
    assert _what_trains(load_run_config(str(older))) == _what_trains(load_run_config("multi30k-en-de",
                                                                                     {"data.path": "."}))


def test_an_fp16_override_of_a_shipped_config_trains_in_float16():
    assert load_run_config("multi30k-en-de", {"data.path": ".", "training.fp16": True}).training.precision == "fp16"


@pytest.mark.parametrize("keys,message", [
    ("training:\n  bf16: true\n  fp16: true\n", "training.bf16: true and training.fp16: true name different "
                                                "precisions: keep one (training.precision: auto, bf16, fp16, fp32)"),
    ("training:\n  precision: fp32\n  fp16: true\n", "training.fp16: true and training.precision: fp32 name "
                                                     "different precisions"),
    ("training:\n  bf16: sometimes\n", "training.bf16 must be true, false or auto (or use training.precision: auto, "
                                       "bf16, fp16, fp32), got 'sometimes'"),
    ("training:\n  fp16: auto\n", "training.fp16 must be true or false"),
    ("training:\n  precision: fp8\n", "training.precision must be one of auto, bf16, fp16, fp32, got 'fp8'"),
])
def test_precisions_that_contradict_or_do_not_exist_are_refused_in_one_line(tmp_path, keys, message):
    with pytest.raises(ConfigError) as error:
        _training(tmp_path, keys)
    assert message in str(error.value) and "\n" not in str(error.value)


@pytest.mark.parametrize("line,expected", [(AVX2_ONLY, {"bf16": False, "fp16": False}),
                                           (ZEN4, {"bf16": True, "fp16": False})])
def test_the_trainer_arguments_of_an_auto_config_use_bfloat16_where_native(cpu_with, line, expected):
    cpu_with(line)
    training = RunConfig().training
    training.precision = "auto"
    args = VaswaniTrainingArguments.from_config(training, "out", use_cpu=True, report_to=[])
    assert {"bf16": args.bf16, "fp16": args.fp16} == expected


def test_the_trainer_arguments_of_an_fp16_config_are_transformers_fp16():
    training = RunConfig().training
    training.precision = "fp16"
    args = VaswaniTrainingArguments.from_config(training, "out", use_cpu=True, report_to=[])
    assert (args.fp16, args.bf16) == (True, False)
