"""The run record: the one typed place for a run's facts (vaswani_mt/run_record.py)."""

import json

from vaswani_mt.run_record import (Hardware, ModelFacts, RunFolder, RunRecord, Selection, TestScores, TrainingFigures,
                                   last_validation)

# metrics.json as `vaswani-mt train` wrote it before the run record existed (commit c3eb282), abridged.
EARLIER_METRICS = {
    "command": "vaswani-mt train --config multi30k-en-de",
    "training": {"steps": 4, "epochs": 0.07, "wall_seconds_this_process": 19.1, "train_runtime_seconds": 18.9,
                 "target_tokens_per_second_median": 7445.0, "final_train_loss": 9.49, "world_size": 1,
                 "hardware": {"cpu": "AMD EPYC", "cpu_count": 2, "torch_threads": 2, "cuda": False,
                              "torch": "2.13.0+cpu"}},
    "model": {"preset": "tiny", "parameters": 300000, "config": {"d_model": 64}},
    "data": {"train": {"pairs_in": 29000, "pairs_out": 28990}},
    "selection": {"chosen": "best_checkpoint", "best_checkpoint": "runs/x/checkpoints/checkpoint-4",
                  "valid_bleu_best_checkpoint": 0.0016},
    "bleu_signatures_during_training": {"bleu": "nrefs:1|case:mixed", "chrf": "nrefs:1|nc:6"},
    "test": {"split": "test2016", "sentences": 1000, "bleu": 0.17, "bleu_signature": "nrefs:1|case:mixed",
             "chrf": 6.52, "chrf_signature": "nrefs:1|nc:6", "bleu_lowercased_moses_tokenized": 0.17,
             "bleu_lowercased_moses_tokenized_signature": "nrefs:1|case:lc", "num_beams": 4, "seconds": 62.0},
    "a_key_of_a_later_version": 1,
}


def test_a_metrics_json_written_before_the_run_record_reads_into_typed_fields():
    record = RunRecord.from_json(EARLIER_METRICS)
    assert record.training.hardware == Hardware(cpu="AMD EPYC", cpu_count=2, torch_threads=2, cuda=False,
                                                torch="2.13.0+cpu")
    assert record.test.bleu == 0.17 and record.test.split == "test2016" and record.selection.chosen == "best_checkpoint"
    assert record.model.preset == "tiny" and record.data["train"]["pairs_out"] == 28990
    expected = {key: value for key, value in EARLIER_METRICS.items() if key != "a_key_of_a_later_version"}
    written = record.to_json()
    written["training"]["hardware"] = {k: v for k, v in written["training"]["hardware"].items() if v is not None}
    for figure in ("precision", "gradient_accumulation_steps", "skipped_updates", "time_budget"):  # recorded since
        assert written["training"].pop(figure) is None
    assert written == expected  # the same file comes back out, unknown keys dropped


def test_a_record_round_trips_through_the_run_folder_with_the_config_and_model_files_beside_it(tmp_path):
    run = RunFolder(tmp_path / "my-run")
    run.model.mkdir(parents=True)
    run.config.write_text("data:\n  source_lang: en\n  target_lang: de\n", encoding="utf-8")
    (run.model / "config.json").write_text(json.dumps({"d_model": 64}), encoding="utf-8")
    record = RunRecord(command="c", training=TrainingFigures(steps=3), model=ModelFacts(preset="tiny"),
                       selection=Selection(chosen="averaged", averaged_checkpoints=["checkpoint-2", "checkpoint-3"]),
                       test=TestScores(split="test", bleu=12.5))
    record.write(run)
    back = RunRecord.read(run.root)
    assert back.name == "my-run" and back.config["data"]["target_lang"] == "de"
    assert back.model_config == {"d_model": 64} and back.generation_config == {}
    assert (back.training, back.selection, back.test) == (record.training, record.selection, record.test)
    assert "averaged_checkpoints" in json.loads(run.record.read_text())["selection"]
    assert "valid_bleu_averaged" not in json.loads(run.record.read_text())["selection"]  # not measured: left out


def test_a_missing_or_broken_run_folder_reads_as_an_empty_record(tmp_path):
    (tmp_path / "metrics.json").write_text("{not json", encoding="utf-8")
    record = RunRecord.read(tmp_path)
    assert record.test is None and record.config == {} and record.training == TrainingFigures()


def test_training_figures_come_from_the_trainer_log_history():
    class State:
        global_step, epoch = 20, 1.234
        log_history = [{"loss": 5.0, "target_tokens_per_second": 100.0},
                       {"loss": 4.0, "target_tokens_per_second": 300.0},
                       {"eval_bleu": 3.5, "eval_chrf": 20.0, "step": 20},
                       {"loss": 3.0, "target_tokens_per_second": 200.0}, {"train_runtime": 9.5}]

    figures = TrainingFigures.from_trainer_state(State(), 1, wall_seconds_this_process=10.0)
    assert (figures.steps, figures.epochs, figures.final_train_loss) == (20, 1.23, 3.0)
    assert (figures.target_tokens_per_second_median, figures.train_runtime_seconds) == (200.0, 9.5)
    assert figures.wall_seconds_this_process == 10.0
    assert last_validation(State.log_history).bleu == 3.5 and last_validation([]) is None
