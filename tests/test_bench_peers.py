"""scripts/bench_peers.py: reading each toolkit's training log (lines as the toolkits wrote them), the fairseq
rewrite for Python 3.11, and one-line errors for bad input. The benchmark itself is not run here (it trains five
models in four other environments)."""

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_peers.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_peers", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["bench_peers"] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("bench_peers", None)


OURS = (
    '2026-11-27 13:42:39,390 INFO vaswani_mt.train: train: step 1/30, loss 9.807, lr 2.50e-06, '
    '1,451 target tok/s, elapsed 2 s, ETA 1 min 12 s\n'
    '2026-11-27 13:42:55,081 INFO vaswani_mt.train: train: step 10/30, loss 9.745, lr 2.50e-05,'
    ' 2,136 target tok/s, elapsed 18 s, ETA 36 s\n'
    '2026-11-27 13:43:02,669 INFO vaswani_mt.train: train: step 20/30, loss 9.521, lr 5.00e-05,'
    ' 5,252 target tok/s, elapsed 26 s, ETA 13 s\n'
)
FAIRSEQ = (
    '2026-11-27 13:43:29 | INFO | train_inner | epoch 001:     10 / 115 loss=13.799, nll_loss=1'
    '3.78, ppl=14071.5, wps=3196.9, ups=0.79, wpb=4012.4, bsz=274.4, num_updates=10, lr=2.50988'
    'e-05, gnorm=2.742, train_wall=13, wall=14\n'
    '2026-11-27 13:43:42 | INFO | train_inner | epoch 001:     20 / 115 loss=13.434, nll_loss=1'
    '3.376, ppl=10628.7, wps=2829.5, ups=0.77, wpb=3669.7, bsz=247.2, num_updates=20, lr=5.0097'
    '5e-05, gnorm=2.373, train_wall=13, wall=27\n'
)
OPENNMT = (
    '[2026-11-27 13:44:07,440 INFO] Start training loop and validate every 10000000 steps...\n'
    '[2026-11-27 13:44:28,187 INFO] Step 10/   30; acc: 0.0; ppl: 9636.1; xent: 9.2; lr: 0.0000'
    '3; sents:    2587; bsz: 3586/3861/259; 1728/1861 tok/s;     21 sec;\n'
)
EOLE = (
    '[2026-11-27 13:45:25,018 INFO] Step 10/   30; acc: 0.0; ppl: 9761.57; xent: 9.19; aux: 0.0'
    '00; mtp: 0.000; attn_ent: 2.381; lr: 2.50e-05; sents:    2587; bsz: 3586/3861/259; 2252/24'
    '25 tok/s;     16 sec;\n'
    '[2026-11-27 13:45:37,833 INFO] Step 20/   30; acc: 0.1; ppl: 9110.01; xent: 9.12; aux: 0.0'
    '00; mtp: 0.000; attn_ent: 2.331; lr: 5.00e-05; sents:    2723; bsz: 3451/3940/272; 2693/30'
    '74 tok/s;     29 sec;\n'
)
SOCKEYE = (
    '[INFO:sockeye.training] Training started.\n'
    '[INFO:sockeye.training] E=0 B=20\ts/sec=71.63 tok/sec=1503.60 u/sec=0.26\tppl=9881.550590 \n'
)
SOCKEYE_CHECKPOINT = (
    '[INFO:sockeye.training] Checkpoint [1]\tUpdates=30 Epoch=0 Samples=8696 Time-cost=95.269 Up'
    'dates/sec=104966.007\n'
)


def test_ours(bench):
    intervals = bench.parse_log("ours", OURS)
    assert [i.update for i in intervals] == [10, 20]  # step 1's line only starts the first interval
    assert intervals[1].tokens_per_second == 5252
    # 5,252 tok/s over the 7.588 s between the lines, 10 updates
    assert intervals[1].tokens_per_update == pytest.approx(5252 * 7.588 / 10)
    assert intervals[0].tokens_per_update == pytest.approx(2136 * 15.691 / 9)


def test_fairseq(bench):
    intervals = bench.parse_log("fairseq", FAIRSEQ)
    assert [(i.update, i.tokens_per_second, i.tokens_per_update) for i in intervals] == [
        (10, 3196.9, 4012.4), (20, 2829.5, 3669.7)]


@pytest.mark.parametrize("system, text, expected", [
    ("opennmt-py", OPENNMT, [(10, 1861, 3861)]),
    ("eole", EOLE, [(10, 2425, 3861), (20, 3074, 3940)]),
])
def test_opennmt_and_eole_count_the_target_half(bench, system, text, expected):
    intervals = bench.parse_log(system, text)
    assert [(i.update, i.tokens_per_second, i.tokens_per_update) for i in intervals] == expected


def test_sockeye_counts_sentences_times_target_length(bench):
    (interval,) = bench.parse_log("sockeye", SOCKEYE, 13.0)
    assert interval.update == 20
    assert interval.tokens_per_second == pytest.approx(71.63 * 13.0)  # not its tok/sec (padded source)
    assert interval.tokens_per_update == pytest.approx(71.63 / 0.26 * 13.0)
    (interval,) = bench.parse_log("sockeye", SOCKEYE + SOCKEYE_CHECKPOINT, 13.0)
    assert interval.tokens_per_update == pytest.approx(8696 / 30 * 13.0)  # the checkpoint's exact counts


def test_other_lines_are_ignored(bench):
    for system in bench.SYSTEMS:
        assert bench.parse_log(system, "loading data\nStep 10 done\nwps=3\n", 13.0) == []


def test_fairseq_dataclass_defaults_become_factories(bench):
    source = (
        '"""Doc."""\n'
        "from dataclasses import dataclass\n"
        "from omegaconf import II\n\n"
        "@dataclass\nclass A:\n    x: int = 1\n\n"
        "@dataclass\nclass B:\n    a: A = A()\n    b: A = A(x=2)\n    c: int = II('a.x')\n"
        "    d: A = field(default=A())\n"
    )
    classes = bench.dataclass_names(source)
    text, count = bench.rewrite_dataclass_defaults(source, classes)
    assert count == 3
    assert "a: A = field(default_factory=A)" in text
    assert "b: A = field(default_factory=lambda: A(x=2))" in text
    assert "d: A = field(default_factory=A)" in text
    assert "c: int = II('a.x')" in text  # not a dataclass: left alone
    assert text.splitlines()[1] == "from dataclasses import field"  # after the docstring
    assert bench.rewrite_dataclass_defaults(text, classes) == (text, 0)  # idempotent
    namespace = {"II": str}
    exec(compile(text.replace("from omegaconf import II\n", ""), "m", "exec"), namespace)  # Python 3.11 accepts it
    assert namespace["B"]().b.x == 2
    fixed = bench.FIELD_DEFAULT.sub(bench.FIELD_DEFAULT_FIX, "v = B.__dataclass_fields__[k].default\n")
    namespace["k"] = "a"
    exec(fixed, namespace)
    assert isinstance(namespace["v"], namespace["A"])


@pytest.mark.parametrize("argv, message", [
    (["--systems", "marian"], "unknown system 'marian'"),
    (["--updates", "5"], "--updates must be at least 20"),
    (["--batch-fairseq", "0"], "batch sizes must be positive"),
])
def test_bad_input_is_one_line(bench, capsys, tmp_path, argv, message):
    assert bench.main([*argv, "--cache-dir", str(tmp_path)]) == 1
    err = capsys.readouterr().err.strip()
    assert message in err and len(err.splitlines()) == 1


def test_missing_data_or_environment_is_one_line(bench, capsys, tmp_path):
    assert bench.main(["--cache-dir", str(tmp_path), "--data", str(tmp_path / "nowhere")]) == 1
    assert "no train.en in" in capsys.readouterr().err
    (tmp_path / "data").mkdir()
    for split in bench.SPLITS:
        for lang in ("en", "de"):
            (tmp_path / "data" / f"{split}.{lang}").write_text("a\n")
    assert bench.main(["--cache-dir", str(tmp_path), "--data", str(tmp_path / "data")]) == 1
    assert "tools is not installed" in capsys.readouterr().err


def test_ours_share_of_the_cpu_is_its_model_flops_per_second_over_the_cpus_float32_product_rate(
        bench, tmp_path, monkeypatch):
    import json

    from benchmark_common import model_flops
    from vaswani_mt import VaswaniConfig

    (tmp_path / "stats.json").write_text(json.dumps({"tokens_per_sentence_en": 15.0, "tokens_per_sentence_de": 16.0}))
    monkeypatch.setattr(bench, "matmul_rate", lambda: 200.0)
    monkeypatch.setattr(bench, "wait_for_idle", lambda *args: 0.0)
    line = bench.share_of_the_cpu(bench.Data(tmp_path, tmp_path), 5000.0, type("A", (), {
        "idle_threshold": 0.1, "max_wait": 1.0}))
    per_token = model_flops(VaswaniConfig.from_preset("mini", vocab_size=10000), 1, 15.0, 16.0) / 16.0
    assert 15e6 < per_token < 17e6  # 6 x 2.6M parameters, and attention's share
    assert f"ours: {5000 * per_token / 1e9:.0f} GFLOP/s" in line and "200 GFLOP/s" in line
    assert line.endswith(f"= {100 * 5000 * per_token / 1e9 / 200:.0f} % of it")


def test_the_cpus_float32_product_rate_is_measured_in_gflops(bench):
    assert 1.0 < bench.matmul_rate(size=256, repetitions=3) < 1e5


def _option(command: list[str], flag: str) -> float:
    return float(command[command.index(flag) + 1])


def test_every_system_warms_up_to_the_same_peak_learning_rate(bench, tmp_path):
    """Each toolkit states its schedule in its own terms; read with each toolkit's formula, all reach PEAK_LR at the
    end of the warm-up (sockeye's inv-sqrt-decay divides its base rate by sqrt(warm-up): given PEAK_LR itself, it
    peaked 28x lower)."""
    import json

    for name in bench.INSTALLS:  # the jobs look for each toolkit's interpreter
        (bench.venv_of(tmp_path, name) / "bin").mkdir(parents=True)
        (bench.venv_of(tmp_path, name) / "bin" / "python").touch()
    data = bench.Data(tmp_path / "multi30k", tmp_path / "prepared")
    warmup, peak = bench.WARMUP, bench.PEAK_LR
    ours = bench.job_ours(data, tmp_path / "ours", 4096, 100, None, []).command
    noam = _option(ours, "--training.noam_factor") * 128 ** -0.5 * _option(ours, "--training.warmup_steps") ** -0.5
    fairseq = bench.job_fairseq(tmp_path, data, tmp_path / "f", 4860, 100, None).command
    onmt = json.loads(bench.job_onmt(tmp_path, data, tmp_path / "o", 4670, 100, 100, eole=False).config)
    eole = json.loads(bench.job_onmt(tmp_path, data, tmp_path / "e", 4670, 100, 100, eole=True).config)["training"]
    sockeye = bench.job_sockeye(tmp_path, data, tmp_path / "s", 3800, 100, 100).command
    sockeye_warmup = _option(sockeye, "--learning-rate-warmup")
    rates = {
        "ours": noam,
        "fairseq": _option(fairseq, "--lr") if _option(fairseq, "--warmup-updates") == warmup else None,
        "opennmt-py": onmt["learning_rate"] * 128 ** -0.5 * onmt["warmup_steps"] ** -0.5,
        "eole": eole["learning_rate"] * 128 ** -0.5 * eole["warmup_steps"] ** -0.5,
        "sockeye": _option(sockeye, "--initial-learning-rate") / sockeye_warmup ** 0.5,
    }
    assert rates == pytest.approx({system: peak for system in rates}, rel=1e-3)
    assert sockeye_warmup == onmt["warmup_steps"] == eole["warmup_steps"] == warmup
