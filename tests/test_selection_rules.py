"""scripts/selection_rules.py: a run's best checkpoint against the average of its last weights, each rule's choice made
on one half of valid and scored on the other."""

import json

import pytest
import yaml
from conftest import load_script

from vaswani_mt.inference.translate import translate_lines

SOURCES = ["a dog runs in the park .", "the cat sleeps on a red sofa .", "children play in the snow .",
           "a man rides a bike .", "two women sit on a bench .", "a boy jumps into the water ."]


def _script():
    return load_script("selection_rules")


@pytest.fixture
def run(tmp_path, tokenizer, model, make_tiny_model):
    """A finished run whose best checkpoint writes the references of the even sentences and whose average writes
    those of the odd ones: each candidate scores 100 on one half and less on the other."""
    folder = tmp_path / "run"
    # seeds whose translations hold 4-grams on the half each one writes (a tiny random model often writes one word)
    checkpoint, average = (make_tiny_model(seed=seed, vocab_size=len(tokenizer)) for seed in (4, 3))
    for candidate in (checkpoint, average):
        candidate.generation_config = model.generation_config  # beam 4, length penalty 0.6: the run's decoding
    checkpoint.save_pretrained(folder / "checkpoints" / "checkpoint-20")
    average.save_pretrained(folder / "averaged")
    average.save_pretrained(folder / "model")
    tokenizer.save_pretrained(folder / "model")
    written = [list(translate_lines(candidate, tokenizer, SOURCES)) for candidate in (checkpoint, average)]
    assert all(a != b for a, b in zip(*written))  # the two write different translations of every sentence
    references = [written[k % 2][k] for k in range(len(SOURCES))]
    data = tmp_path / "data"
    data.mkdir()
    (data / "valid.en").write_text("\n".join(SOURCES) + "\n", encoding="utf-8")
    (data / "valid.de").write_text("\n".join(references) + "\n", encoding="utf-8")
    config = {"data": {"path": str(data), "source_lang": "en", "target_lang": "de", "valid_split": "valid"}}
    (folder / "config.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    selection = {"chosen": "averaged", "best_checkpoint": "/elsewhere/run/checkpoints/checkpoint-20"}
    (folder / "metrics.json").write_text(json.dumps({"selection": selection}), encoding="utf-8")
    return folder


def test_each_half_is_scored_by_the_choice_made_on_the_other_half(run, capsys):
    assert _script().main([str(run)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("CPU: ") and lines[1].startswith("| run | checkpoint | half |")
    even, odd = (line.split(" | ") for line in lines[3:5])
    # on the odd half the average scored 100: the even half gets the average, and the rules agree there
    assert even[1:3] == ["checkpoint-20", "even"] and even[3].endswith(" / 100.00") and even[4] == "average"
    assert even[5] == even[6] and even[7] == "+0.00 |"
    # on the even half the checkpoint scored 100: the odd half gets it, and it loses to the average there
    assert odd[2] == "odd" and odd[3].startswith("100.00 / ") and odd[4] == "checkpoint" and odd[6] == "100.00"
    assert float(odd[7].rstrip(" |")) < 0
    assert lines[5].startswith("mean difference, the higher on valid minus always the average: -") and \
        lines[5].endswith("over 2 halves (0 higher, 1 the same, 1 lower)")


def test_a_run_without_its_best_checkpoint_on_disk_is_one_line_naming_it(run, capsys):
    for name in ("config.json", "model.safetensors"):
        (run / "checkpoints" / "checkpoint-20" / name).unlink()
    assert _script().main([str(run)]) == 1
    assert capsys.readouterr().err == (f"selection_rules.py: {run / 'checkpoints' / 'checkpoint-20'}: the best "
                                       "checkpoint is not on disk\n")
