"""scripts/bench_peers.py: reading each toolkit's training log (lines as the toolkits wrote them), the checkpoint each
saved where a race stopped it, the tables, the process settings every system gets, the race's stop, each toolkit's
own learning-rate schedule, the fairseq rewrite for Python 3.11, and one-line errors for bad input. The benchmark
itself is not run here (it trains the models in four other environments); the tests that need a toolkit's
environment (`bench_peers.py --install`, under $VASWANI_MT_PEERS_CACHE or ~/.cache/vaswani_mt/peers) skip without
it."""

import importlib.util
import os
import subprocess
import sys
import time
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
def test_opennmt_and_eole_count_the_target_half_and_the_target_tokens_per_update_of_their_bsz_field(
        bench, system, text, expected):
    """`A/B tok/s`: B, target tokens/s; `bsz: S/T/N`: T, the interval's target tokens over its batches (one batch per
    update), not a figure made from the interval's seconds."""
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


# -- the same process settings for every system -------------------------------------------------------------------------
@pytest.fixture
def jobs(bench, tmp_path):
    """Every system's job, as `make_job` builds it for a speed run (`updates`) or a race (`minutes`), on data files
    that exist (sockeye's argument parser checks them)."""
    for name in bench.INSTALLS:  # the jobs look for each toolkit's interpreter
        (bench.venv_of(tmp_path, name) / "bin").mkdir(parents=True)
        (bench.venv_of(tmp_path, name) / "bin" / "python").touch()
    return _jobs_of(bench, tmp_path, tmp_path)


def _jobs_of(bench, cache, tmp_path):
    data = bench.Data(tmp_path / "multi30k", tmp_path / "prepared")
    data.pieces.mkdir(parents=True, exist_ok=True)
    data.raw.mkdir(parents=True, exist_ok=True)
    for split in bench.SPLITS:
        for lang in ("en", "de"):
            (data.pieces / f"{split}.{lang}").write_text("▁a ▁b\n")
            (data.raw / f"{split}.{lang}").write_text("a b\n")
    (data.root / "vocab.txt").write_text("▁a\t1\n▁b\t1\n")
    args = type("Args", (), {"cache_dir": cache, "ours_override": "",
                             "sockeye_default_warmup": bench.SOCKEYE_DEFAULT_WARMUP,
                             **{f"batch_{s.replace('-', '_')}": b for s, b in bench.DEFAULT_BATCH.items()}})

    def make(system, malloc="keep", updates=100, minutes=None):
        return bench.make_job(system, args, data, tmp_path / "runs" / malloc / system, updates, minutes, malloc)
    return make


SETTINGS = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "GOMP_SPINCOUNT", "MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


@pytest.mark.parametrize("minutes", [None, 15])
def test_every_system_runs_with_the_same_threads_spin_count_and_malloc_settings(bench, jobs, monkeypatch, minutes):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "1")  # the caller's own malloc settings reach no system
    monkeypatch.setenv("GOMP_SPINCOUNT", "300000")
    for malloc in bench.MALLOCS:
        settings = {system: {name: jobs(system, malloc, None if minutes else 100, minutes).env.get(name)
                             for name in (*SETTINGS, "MALLOC_ARENA_MAX")} for system in bench.SYSTEMS}
        assert all(values == settings["ours"] for values in settings.values()), settings
        from vaswani_mt.recipe.host_memory import MMAP_THRESHOLD, TRIM_THRESHOLD

        keeps = malloc == "keep"
        assert settings["ours"] == {"OMP_NUM_THREADS": "2", "MKL_NUM_THREADS": "2", "GOMP_SPINCOUNT": "10000",
                                    "MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD) if keeps else None,
                                    "MALLOC_TRIM_THRESHOLD_": str(TRIM_THRESHOLD) if keeps else None,
                                    "MALLOC_ARENA_MAX": None}
        ours = jobs("ours", malloc, None if minutes else 100, minutes).command
        assert ours[1:3] == (["-m", "vaswani_mt.cli"] if keeps else ["-c", bench.OURS_WITHOUT_MALLOC_SETTING])
        assert "--training.num_threads" in ours and ours[ours.index("--training.num_threads") + 1] == "2"


PAGE_FAULTS = (  # minor page faults of allocating, touching and freeing 80 MB ten times, after a first time
    "import resource\n"
    "def faults(): return resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
    "block = bytearray(80_000_000); del block\n"
    "before = faults()\n"
    "for _ in range(10):\n"
    "    block = bytearray(80_000_000); del block\n"
    "print(faults() - before)\n")


def _page_faults(env: dict, head: str = "") -> int:
    done = subprocess.run([sys.executable, "-c", head + PAGE_FAULTS], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[-1])


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux")
def test_the_keep_setting_keeps_freed_memory_in_a_toolkits_process_and_the_default_one_does_not(bench):
    """80 MB blocks come from mmap with glibc's defaults, zero-filled page by page every time; with the MALLOC_*
    variables every toolkit's process gets, from the heap, reused (what `vaswani-mt train` sets with mallopt)."""
    assert _page_faults(bench.peer_env("keep")) < 1000
    assert _page_faults(bench.peer_env("default")) > 10_000


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings: Linux")
def test_ours_without_the_malloc_setting_leaves_glibcs_defaults(bench):
    """`--malloc default` runs `vaswani-mt train` with its mallopt call left out: the run's `keep_freed_memory`
    then sets nothing, and 80 MB blocks are mapped afresh each time, as in a toolkit's process."""
    launcher = bench.OURS_WITHOUT_MALLOC_SETTING
    head = launcher[:launcher.index("from vaswani_mt.cli import main")]
    check = "from vaswani_mt.recipe.host_memory import keep_freed_memory\nassert keep_freed_memory() is False\n"
    env = bench.peer_env("default", {"PYTHONPATH": str(SCRIPT.parents[1])})
    assert _page_faults(env, head + check) > 10_000
    keeping = "from vaswani_mt.recipe.host_memory import keep_freed_memory\nassert keep_freed_memory() is True\n"
    assert _page_faults(env, keeping) < 1000  # without the launcher's change, ours keeps freed memory itself


def test_a_run_of_ours_whose_log_contradicts_its_malloc_setting_stops_the_benchmark(bench, jobs):
    line = "2026-11-28 10:09:33,000 INFO vaswani_mt.train: malloc keeps freed memory for the next step\n"
    bench.check_ours_malloc(jobs("ours", "keep"), line)
    bench.check_ours_malloc(jobs("ours", "default"), "")
    with pytest.raises(bench.BenchError, match="asked for 'default'"):
        bench.check_ours_malloc(jobs("ours", "default"), line)
    with pytest.raises(bench.BenchError, match="asked for 'keep'"):
        bench.check_ours_malloc(jobs("ours", "keep"), "")
    bench.check_ours_malloc(jobs("fairseq", "default"), line)  # the toolkits' logs say nothing of it


def test_each_toolkit_as_shipped_differs_from_its_equal_settings_run_only_in_its_own_defaults(bench, jobs):
    import json

    def where(job):  # each run has a folder of its own
        return job.config.replace(str(job.folder), "FOLDER") if job.config else [
            argument.replace(str(job.folder), "FOLDER") for argument in job.command]

    eole, shipped = (json.loads(where(jobs(s))) for s in ("eole", "eole-default"))
    assert eole["model"].pop("encoder") == {"encoder_layer_style": "postnorm"} and eole == shipped
    sockeye, shipped = where(jobs("sockeye")), where(jobs("sockeye-default"))
    equal_only = ["--transformer-preprocess", "", "--transformer-postprocess", "drn"]  # sockeye's own: "n", "dr"
    index = sockeye.index("--transformer-preprocess")
    assert sockeye[index:index + 4] == equal_only
    without = sockeye[:index] + sockeye[index + 4:]
    differ = [(a, b) for a, b in zip(without, shipped) if a != b]
    assert len(without) == len(shipped) and [d[1] for d in differ] == [
        str(bench.PEAK_LR * bench.SOCKEYE_DEFAULT_WARMUP ** 0.5), str(bench.SOCKEYE_DEFAULT_WARMUP)]


# -- the race: where each system stopped, and the table -------------------------------------------------------------
FAIRSEQ_RACE = (  # fairseq's checkpoint_utils line (its format string), at an epoch's end and at the stop
    '2026-11-27 14:01:12 | INFO | fairseq.checkpoint_utils | Saved checkpoint /runs/race/keep/fairseq/checkpoints/chec'
    'kpoint_last.pt (epoch 8 @ 805 updates, score None) (writing took 0.05 seconds)\n'
    '2026-11-27 14:13:40 | INFO | fairseq_cli.train | Stopping training due to cumulative_training_time: 0.2500283 > '
    'stop_time_hours: 0.25 hour(s)\n'
    '2026-11-27 14:13:40 | INFO | fairseq.checkpoint_utils | Saved checkpoint /runs/race/keep/fairseq/checkpoints/chec'
    'kpoint_last.pt (epoch 8 @ 903 updates, score None) (writing took 0.06 seconds)\n'
)
OURS_RACE = (
    '2026-11-28 10:09:52,256 INFO vaswani_mt.train: training.max_minutes (15) reached at update 1693: saving and '
    'stopping\n'
)
SOCKEYE_RACE = (  # RACE_STOP's end of sockeye 3.1.34's training, as it wrote it
    '[INFO:sockeye.training] E=0 B=10\ts/sec=110.16 tok/sec=2238.65 u/sec=0.46\tppl=9478.940537 \n'
    '[INFO:sockeye.training] Maximum # of updates (11) reached.\n'
    '[INFO:sockeye.training] Checkpoint [1]\tUpdates=11 Epoch=0 Samples=2696 Time-cost=27.574 Updates/sec=362661.548'
    '\n[INFO:sockeye.training] Checkpoint [1]\tTrain-ppl=9389.025806\n'
)


def test_each_race_system_is_scored_with_the_model_it_saved_where_it_stopped(bench, tmp_path):
    import json

    ours = tmp_path / "ours"
    (ours / "run").mkdir(parents=True)
    assert bench.stop_checkpoint("ours", ours, OURS_RACE) == bench.Stop(ours / "run" / "model", 1693)
    (ours / "run" / "metrics.json").write_text(json.dumps(
        {"selection": {"chosen": "best_checkpoint", "best_checkpoint": str(ours / "run/checkpoints/checkpoint-1693")}}))
    assert bench.stop_checkpoint("ours", ours, "").update == 1693  # the final model's own checkpoint
    fairseq = tmp_path / "fairseq"
    assert bench.stop_checkpoint("fairseq", fairseq, FAIRSEQ_RACE) == bench.Stop(
        fairseq / "checkpoints" / "checkpoint_last.pt", 903)
    onmt = tmp_path / "onmt"
    onmt.mkdir()
    for step in (6, 100, 1046):
        (onmt / f"model_step_{step}.pt").touch()
    assert bench.stop_checkpoint("opennmt-py", onmt, OPENNMT) == bench.Stop(onmt / "model_step_1046.pt", 1046)
    eole = tmp_path / "eole"
    for step in (10, 873):
        (eole / "model" / f"step_{step}").mkdir(parents=True)
    assert bench.stop_checkpoint("eole-default", eole, EOLE) == bench.Stop(eole / "model" / "step_873", 873)
    sockeye = tmp_path / "sockeye"
    (sockeye / "model").mkdir(parents=True)
    (sockeye / "model" / "params.00001").touch()
    assert bench.stop_checkpoint("sockeye", sockeye, SOCKEYE_RACE) == bench.Stop(
        sockeye / "model" / "params.00001", 11, 1)
    with pytest.raises(bench.BenchError, match="fairseq saved no checkpoint"):
        bench.stop_checkpoint("fairseq", fairseq, FAIRSEQ)


def test_the_race_table_gives_each_systems_layers_warm_up_malloc_and_the_update_it_was_scored_at(bench):
    results = [bench.RaceResult("ours", "keep", 1693, 1690, 3865, 34.01),
               bench.RaceResult("sockeye-default", "keep", 455, 450, 3776, 20.5, warmup=200)]
    found = {"ours": ("0.1.0 abc1234", "2.13.0+cpu"), "sockeye-default": ("3.1.34", "1.13.1+cu117")}
    header, rule, ours, sockeye = bench.race_table(15, "test2016", results, found)
    assert "updates in 15 min: scored (last logged)" in header and rule.count("|") == header.count("|")
    assert ours == "| vaswani_mt | 0.1.0 abc1234 | post-norm | 800 | keep | 1,693 (1,690) | 3,865 | 34.01 |"
    assert sockeye == ("| sockeye, as shipped | 3.1.34 | pre-norm (its default) | 200 | keep | 455 (450) | 3,776 | "
                       "20.50 |")


def test_the_speed_table_compares_ours_with_each_toolkit_under_the_same_malloc_setting(bench):
    def result(system, malloc, rate):
        return bench.Result(system, malloc, [bench.Interval(10, rate, 3858), bench.Interval(20, rate, 3858)], 1)
    results = {("ours", "keep"): result("ours", "keep", 7000), ("ours", "default"): result("ours", "default", 4000),
               ("fairseq", "keep"): result("fairseq", "keep", 3500),
               ("fairseq", "default"): result("fairseq", "default", 2000)}
    args = type("Args", (), {f"batch_{s.replace('-', '_')}": b for s, b in bench.DEFAULT_BATCH.items()})
    found = {"ours": ("0.1.0 abc1234", "2.13.0+cpu"), "fairseq": ("0.12.2", "2.13.0+cpu")}
    lines = bench.speed_table(args, results, found)
    rows = {tuple(line.split(" | ")[i] for i in (0, 3)): line.split(" | ")[8] for line in lines[2:6]}
    assert rows == {("| vaswani_mt", "keep"): "–", ("| vaswani_mt", "default"): "–",
                    ("| fairseq", "keep"): "2.00×", ("| fairseq", "default"): "2.00×"}
    assert lines[-2:] == ["| vaswani_mt | 1.75× |", "| fairseq | 1.75× |"]  # keep ÷ default, each system


# -- the race's stop, in each toolkit's own process -------------------------------------------------------------------
FAKE_TOOLKIT = '''
import json, sys, time

class Trainer:  # OpenNMT-py's and eole's loop: batches through _accum_batches, a final save after it
    def _accum_batches(self, iterator):
        yield from iterator

class State:
    updates = 0

class Config:
    max_updates = 10 ** 7

class EarlyStoppingTrainer:  # sockeye's: _step per update, a checkpoint once max_updates is reached
    def __init__(self):
        self.state, self.config = State(), Config()

    def _step(self, batch):
        time.sleep(0.05)
        self.state.updates += 1
        return True

def main():
    if sys.argv[1] == "batches":
        step = 0
        for step, batch in enumerate(Trainer()._accum_batches(range(10 ** 6)), 1):
            time.sleep(0.05)
        print(json.dumps({"argv": sys.argv, "saved at": step}))
    else:
        trainer = EarlyStoppingTrainer()
        while trainer.state.updates != trainer.config.max_updates:
            trainer._step(None)
        print(json.dumps({"argv": sys.argv, "saved at": trainer.state.updates}))
'''


@pytest.mark.parametrize("how", ["batches", "updates"])
def test_the_race_stop_ends_training_at_the_deadline_where_the_toolkit_then_saves(bench, tmp_path, how):
    import json

    (tmp_path / "fake_toolkit.py").write_text(FAKE_TOOLKIT)
    (tmp_path / "sockeye").mkdir()
    (tmp_path / "sockeye" / "__init__.py").write_text("")
    (tmp_path / "sockeye" / "constants.py").write_text("MEASURE_SPEED_EVERY = 50\n")
    code = bench.RACE_STOP
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", code, "0.02", how, "fake_toolkit", "fake_toolkit:main", how],
                          capture_output=True, text=True, cwd=tmp_path, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(tmp_path)})
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    assert report["argv"] == ["fake_toolkit", how]  # the toolkit's own arguments
    assert 10 <= report["saved at"] <= 30  # 1.2 s of 0.05 s updates, then its own save
    assert time.monotonic() - started < 30


def _installed(bench, toolkit: str):
    python = bench.venv_of(bench.DEFAULT_CACHE, toolkit) / "bin" / "python"
    if not python.exists():
        pytest.skip(f"{toolkit} is not installed in {python.parents[1]} (python scripts/bench_peers.py --install; "
                    "VASWANI_MT_PEERS_CACHE says where)")


@pytest.mark.parametrize("toolkit, arguments", [("opennmt-py", ["--help"]), ("eole", ["train", "--help"]),
                                                ("sockeye", ["--help"])])
def test_the_race_stop_finds_what_it_changes_in_the_installed_toolkit(bench, toolkit, arguments):
    _installed(bench, toolkit)
    done = subprocess.run(bench.race_command(bench.DEFAULT_CACHE, toolkit, 1, arguments), capture_output=True,
                          text=True, env=bench.peer_env(), timeout=300)
    assert done.returncode == 0 and "usage:" in done.stdout, done.stderr[-2000:]


# -- the same peak rate, read from each toolkit's own schedule code ---------------------------------------------------
@pytest.mark.parametrize("system", ["ours", "fairseq", "opennmt-py", "eole", "eole-default", "sockeye",
                                    "sockeye-default"])
def test_every_system_warms_up_to_the_same_peak_rate_by_its_own_schedule_code(bench, tmp_path, system):
    """Each toolkit states its schedule in its own terms; its own option parsing and schedule code, run in its
    environment on the job's command or config, must reach PEAK_LR at the end of the warm-up and fall as ours after
    it (sockeye's inv-sqrt-decay divides its base rate by sqrt(warm-up): given PEAK_LR itself, it peaked 28x lower)."""
    toolkit = bench.TOOLKIT[system]
    if toolkit != "ours":
        _installed(bench, toolkit)
    job = _jobs_of(bench, bench.DEFAULT_CACHE, tmp_path)(system)
    rates = bench.learning_rates(bench.DEFAULT_CACHE, job, 4 * bench.WARMUP)
    warmup = bench.SOCKEYE_DEFAULT_WARMUP if system == "sockeye-default" else bench.WARMUP
    peak = max(rates)
    assert peak == pytest.approx(bench.PEAK_LR, rel=1e-3)
    assert warmup <= rates.index(peak) + 1 <= warmup + 1  # fairseq's update n runs at the rate set after n - 1
    for update in (2 * bench.WARMUP, 4 * bench.WARMUP):  # the inverse square root after it
        assert rates[update - 1] == pytest.approx(bench.PEAK_LR * (warmup / update) ** 0.5, rel=2e-3)
