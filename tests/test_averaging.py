"""Checkpoint averaging (paper §6.1) on small hand-made safetensors checkpoints."""

import json

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

from vaswani_mt.recipe import averaging
from vaswani_mt.cli.average import main
from vaswani_mt.recipe.averaging import average_checkpoints, find_checkpoints


def _weights(seed: int) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    return {
        "encoder.weight": torch.randn(4, 3, generator=generator),
        "decoder.bias": torch.randn(5, generator=generator).to(torch.bfloat16),
        "step_buffer": torch.tensor([7, 8], dtype=torch.int64),
    }


def _checkpoint(folder, weights, config_marker="last"):
    """A Trainer-like checkpoint folder: weights, model files and training state."""
    folder.mkdir(parents=True)
    save_file(weights, folder / "model.safetensors", metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps({"model_type": "vaswani", "marker": config_marker}))
    (folder / "generation_config.json").write_text("{}")
    (folder / "tokenizer.json").write_text("{}")
    (folder / "modeling_vaswani.py").write_text("# remote code\n")
    for state_file in ("optimizer.pt", "scheduler.pt", "rng_state.pth", "trainer_state.json", "training_args.bin"):
        (folder / state_file).write_bytes(b"state")
    (folder / "batch.json").write_text('{"processes": 2, "gradient_accumulation_steps": 1, "max_tokens": 4096}\n')
    return folder


def _assert_bitwise_equal(a: dict, b: dict):
    assert a.keys() == b.keys()
    for key in a:
        assert a[key].dtype == b[key].dtype and torch.equal(a[key], b[key]), key


def test_averaging_copies_of_one_checkpoint_returns_it_bitwise(tmp_path):
    weights = _weights(0)
    paths = [_checkpoint(tmp_path / f"checkpoint-{i}", weights) for i in range(5)]
    _assert_bitwise_equal(average_checkpoints(paths), weights)


def test_averaging_two_checkpoints_gives_their_mean_in_the_original_dtype(tmp_path):
    a, b = _weights(0), _weights(1)
    averaged = average_checkpoints([_checkpoint(tmp_path / "a", a), _checkpoint(tmp_path / "b", b)])
    expected_float = (a["encoder.weight"].double() + b["encoder.weight"].double()) / 2
    torch.testing.assert_close(averaged["encoder.weight"], expected_float.float(), rtol=0, atol=0)
    expected_bf16 = ((a["decoder.bias"].double() + b["decoder.bias"].double()) / 2).to(torch.bfloat16)
    assert averaged["decoder.bias"].dtype == torch.bfloat16
    assert torch.equal(averaged["decoder.bias"], expected_bf16)
    assert torch.equal(averaged["step_buffer"], a["step_buffer"])


def test_bare_safetensors_files_can_be_averaged(tmp_path):
    a, b = _weights(0), _weights(1)
    save_file(a, tmp_path / "a.safetensors")
    save_file(b, tmp_path / "b.safetensors")
    averaged = average_checkpoints([tmp_path / "a.safetensors", tmp_path / "b.safetensors"])
    torch.testing.assert_close(averaged["encoder.weight"], (a["encoder.weight"] + b["encoder.weight"]) / 2)


def test_sharded_checkpoint_is_read_through_its_index(tmp_path):
    weights = _weights(2)
    folder = tmp_path / "sharded"
    folder.mkdir()
    save_file({"encoder.weight": weights["encoder.weight"]}, folder / "model-00001-of-00002.safetensors")
    rest = {k: v for k, v in weights.items() if k != "encoder.weight"}
    save_file(rest, folder / "model-00002-of-00002.safetensors")
    weight_map = {k: "model-00002-of-00002.safetensors" for k in rest}
    weight_map["encoder.weight"] = "model-00001-of-00002.safetensors"
    (folder / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    _assert_bitwise_equal(average_checkpoints([folder, _checkpoint(tmp_path / "single", weights)]), weights)


def test_different_shapes_are_refused_naming_key_shapes_and_files(tmp_path):
    a = _checkpoint(tmp_path / "a", _weights(0))
    wrong = _weights(1)
    wrong["encoder.weight"] = torch.zeros(4, 5)
    b = _checkpoint(tmp_path / "b", wrong)
    with pytest.raises(ValueError) as error:
        average_checkpoints([a, b])
    message = str(error.value)
    assert "encoder.weight" in message and "(4, 3)" in message and "(4, 5)" in message
    assert str(a) in message and str(b) in message


def test_different_key_sets_are_refused_naming_the_key_and_files(tmp_path):
    a = _checkpoint(tmp_path / "a", _weights(0))
    extra = {**_weights(1), "lm_head.weight": torch.zeros(2)}
    b = _checkpoint(tmp_path / "b", extra)
    with pytest.raises(ValueError, match=r"only in .*b.*lm_head\.weight") as error:
        average_checkpoints([a, b])
    assert str(a) in str(error.value)


def test_differing_integer_tensors_are_refused(tmp_path):
    other = _weights(1)
    other["step_buffer"] = torch.tensor([7, 9])
    with pytest.raises(ValueError, match="step_buffer"):
        average_checkpoints([_checkpoint(tmp_path / "a", _weights(0)), _checkpoint(tmp_path / "b", other)])


def test_pickled_weights_are_not_read(tmp_path):
    folder = tmp_path / "checkpoint-1"
    folder.mkdir()
    (folder / "pytorch_model.bin").write_bytes(b"pickle")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        average_checkpoints([folder])


def test_output_folder_has_averaged_weights_metadata_and_last_checkpoints_files(tmp_path):
    first = _checkpoint(tmp_path / "checkpoint-1", _weights(0), config_marker="first")
    last = _checkpoint(tmp_path / "checkpoint-2", _weights(1), config_marker="last")
    out = tmp_path / "averaged"
    averaged = average_checkpoints([first, last], output_dir=out)

    _assert_bitwise_equal(load_file(out / "model.safetensors"), averaged)
    with safe_open(out / "model.safetensors", framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
    assert json.loads((out / "config.json").read_text())["marker"] == "last"
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json",
        "generation_config.json",
        "model.safetensors",
        "modeling_vaswani.py",
        "tokenizer.json",
    ]


def test_failed_write_leaves_no_weights_file_behind(tmp_path, monkeypatch):
    paths = [_checkpoint(tmp_path / f"checkpoint-{i}", _weights(i)) for i in range(2)]
    out = tmp_path / "averaged"

    def fsync_that_fails(fd):
        raise OSError("disk full")

    monkeypatch.setattr(averaging.os, "fsync", fsync_that_fails)
    with pytest.raises(OSError, match="disk full"):
        average_checkpoints(paths, output_dir=out)
    assert not (out / "model.safetensors").exists()
    assert not [p for p in out.iterdir() if "safetensors" in p.name]  # no temp file either


def test_failed_write_keeps_a_previous_output_intact(tmp_path, monkeypatch):
    paths = [_checkpoint(tmp_path / f"checkpoint-{i}", _weights(i)) for i in range(2)]
    out = tmp_path / "averaged"
    previous = average_checkpoints(paths[:1], output_dir=out)
    monkeypatch.setattr(averaging.os, "replace", lambda *args: (_ for _ in ()).throw(OSError("boom")))
    with pytest.raises(OSError, match="boom"):
        average_checkpoints(paths, output_dir=out)
    _assert_bitwise_equal(load_file(out / "model.safetensors"), previous)


def test_output_into_an_input_checkpoint_is_refused(tmp_path):
    path = _checkpoint(tmp_path / "checkpoint-1", _weights(0))
    with pytest.raises(ValueError, match="one of the input checkpoints"):
        average_checkpoints([path], output_dir=path)


def test_find_checkpoints_sorts_numerically_and_skips_incomplete(tmp_path):
    for step in (900, 1000, 50):
        _checkpoint(tmp_path / f"checkpoint-{step}", _weights(0))
    (tmp_path / "checkpoint-2000").mkdir()  # still being written: no weights yet
    (tmp_path / "tmp-checkpoint-3000").mkdir()
    (tmp_path / "checkpoint-abc").mkdir()
    (tmp_path / "runs").mkdir()
    assert [p.name for p in find_checkpoints(tmp_path)] == ["checkpoint-50", "checkpoint-900", "checkpoint-1000"]


def test_cli_averages_the_last_n_checkpoints_of_a_run(tmp_path, capsys):
    run = tmp_path / "run"
    all_weights = {step: _weights(step) for step in (10, 20, 30)}
    for step, weights in all_weights.items():
        _checkpoint(run / f"checkpoint-{step}", weights)
    assert main(["--run-dir", str(run), "--last", "2", "--output", str(tmp_path / "out")]) == 0
    expected = average_checkpoints([run / "checkpoint-20", run / "checkpoint-30"])
    _assert_bitwise_equal(load_file(tmp_path / "out" / "model.safetensors"), expected)
    assert "2 checkpoints" in capsys.readouterr().out


def test_cli_takes_a_train_run_folder_and_averages_the_checkpoints_inside_it(tmp_path, capsys):
    run = tmp_path / "run"  # what `vaswani-mt train` writes: RUN/checkpoints/checkpoint-<step>
    for step in (10, 20, 30):
        _checkpoint(run / "checkpoints" / f"checkpoint-{step}", _weights(step))
    assert main(["--run-dir", str(run), "--last", "2", "--output", str(tmp_path / "out")]) == 0
    expected = average_checkpoints([run / "checkpoints" / "checkpoint-20", run / "checkpoints" / "checkpoint-30"])
    _assert_bitwise_equal(load_file(tmp_path / "out" / "model.safetensors"), expected)


def test_cli_accepts_explicit_inputs(tmp_path):
    a = _checkpoint(tmp_path / "a", _weights(0))
    b = _checkpoint(tmp_path / "b", _weights(1))
    assert main(["--inputs", str(a), str(b), "--output", str(tmp_path / "out")]) == 0
    _assert_bitwise_equal(load_file(tmp_path / "out" / "model.safetensors"), average_checkpoints([a, b]))


def test_cli_copies_no_training_state_into_the_averaged_folder(tmp_path):
    """The batch of the checkpoint's updates (batch.json) and a save-in-progress marker belong to its training, like
    its optimizer state: the averaged folder is a model, which a resume must never take for a checkpoint."""
    a = _checkpoint(tmp_path / "a", _weights(0))
    b = _checkpoint(tmp_path / "b", _weights(1))
    (b / ".saving").write_text("")
    assert main(["--inputs", str(a), str(b), "--output", str(tmp_path / "out")]) == 0
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == [
        "config.json", "generation_config.json", "model.safetensors", "modeling_vaswani.py", "tokenizer.json"]


def test_cli_says_how_many_checkpoints_exist_when_too_few(tmp_path, capsys):
    for step in (1, 2):
        _checkpoint(tmp_path / f"checkpoint-{step}", _weights(0))
    with pytest.raises(SystemExit) as exit_info:
        main(["--run-dir", str(tmp_path), "--last", "5", "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    assert "only 2" in capsys.readouterr().err


def test_cli_reports_a_run_without_checkpoints(tmp_path, capsys):
    with pytest.raises(SystemExit):
        main(["--run-dir", str(tmp_path), "--output", str(tmp_path / "out")])
    assert "no complete checkpoint" in capsys.readouterr().err


def test_cli_reports_incompatible_checkpoints_without_a_traceback(tmp_path, capsys):
    a = _checkpoint(tmp_path / "a", _weights(0))
    b = _checkpoint(tmp_path / "b", {"other": torch.zeros(1)})
    with pytest.raises(SystemExit):
        main(["--inputs", str(a), str(b), "--output", str(tmp_path / "out")])
    assert "different tensor names" in capsys.readouterr().err


def test_averaged_folder_loads_with_from_pretrained(tmp_path):
    """End to end with a real (tiny) transformers model, tied embeddings included."""
    transformers = pytest.importorskip("transformers")
    config = transformers.MarianConfig(
        vocab_size=40, d_model=8, encoder_layers=1, decoder_layers=1, encoder_attention_heads=2,
        decoder_attention_heads=2, encoder_ffn_dim=16, decoder_ffn_dim=16, max_position_embeddings=16,
        pad_token_id=0, decoder_start_token_id=0,
    )  # fmt: skip
    models = []
    for step in (1, 2):
        torch.manual_seed(step)
        models.append(transformers.MarianMTModel(config))
        models[-1].save_pretrained(tmp_path / f"checkpoint-{step}")
    average_checkpoints([tmp_path / "checkpoint-1", tmp_path / "checkpoint-2"], output_dir=tmp_path / "averaged")

    loaded = transformers.MarianMTModel.from_pretrained(tmp_path / "averaged")
    expected = (models[0].model.shared.weight + models[1].model.shared.weight) / 2
    torch.testing.assert_close(loaded.model.shared.weight, expected)
    assert loaded.lm_head.weight.data_ptr() == loaded.model.shared.weight.data_ptr()


def test_cli_defaults_to_the_papers_last_five(tmp_path):
    for step in range(1, 8):
        _checkpoint(tmp_path / "run" / f"checkpoint-{step}", _weights(step))
    main(["--run-dir", str(tmp_path / "run"), "--output", str(tmp_path / "out")])
    expected = average_checkpoints([tmp_path / "run" / f"checkpoint-{step}" for step in range(3, 8)])
    _assert_bitwise_equal(load_file(tmp_path / "out" / "model.safetensors"), expected)


def test_cli_rejects_last_with_explicit_inputs(tmp_path, capsys):
    a = _checkpoint(tmp_path / "a", _weights(0))
    with pytest.raises(SystemExit):
        main(["--inputs", str(a), "--last", "3", "--output", str(tmp_path / "out")])
    assert "--last only applies to --run-dir" in capsys.readouterr().err


# --- one completeness rule with `train --resume` (issue #12) ----------------------------------------------------


def _run_with_saves(run, steps, save_steps):
    for step in steps:
        folder = _checkpoint(run / f"checkpoint-{step}", _weights(step))
        (folder / "trainer_state.json").write_text(json.dumps({"global_step": step, "save_steps": save_steps}))
    return run


@pytest.mark.parametrize("damage", ["saving marker", "no rng_state.pth", "no training_args.bin", "truncated weights"])
def test_average_run_dir_skips_an_unfinished_or_half_deleted_checkpoint_naming_why(tmp_path, capsys, damage):
    run = _run_with_saves(tmp_path / "run", (10, 20, 30), save_steps=10)
    newest = run / "checkpoint-30"
    if damage == "saving marker":
        (newest / ".saving").touch()
    elif damage == "truncated weights":
        data = (newest / "model.safetensors").read_bytes()
        (newest / "model.safetensors").write_bytes(data[: len(data) - 7])
    else:
        (newest / damage.split()[1]).unlink()
    assert [p.name for p in find_checkpoints(run)] == ["checkpoint-10", "checkpoint-20"]
    assert main(["--run-dir", str(run), "--last", "2", "--output", str(tmp_path / "out")]) == 0
    captured = capsys.readouterr()
    assert "skipping checkpoint-30" in captured.err
    assert "checkpoint-10" in captured.out and "checkpoint-20" in captured.out and "checkpoint-30" not in captured.out


def test_average_run_dir_takes_the_last_saves_never_an_older_best_checkpoint(tmp_path, capsys):
    """Rotation keeps the best checkpoint (here step 10) besides the newest ones: it is not one of the last saves."""
    run = _run_with_saves(tmp_path / "run", (10, 110, 120, 125), save_steps=10)
    assert main(["--run-dir", str(run), "--last", "3", "--output", str(tmp_path / "out")]) == 0
    expected = average_checkpoints([run / "checkpoint-110", run / "checkpoint-120", run / "checkpoint-125"])
    _assert_bitwise_equal(load_file(tmp_path / "out" / "model.safetensors"), expected)
    with pytest.raises(SystemExit) as exit_info:
        main(["--run-dir", str(run), "--last", "4", "--output", str(tmp_path / "out4")])
    assert exit_info.value.code == 2
    assert "only 3 consecutive complete saves" in capsys.readouterr().err


@pytest.mark.parametrize("cut", [0, 5, 40])
def test_average_names_an_empty_or_truncated_weights_file(tmp_path, capsys, cut):
    a = _checkpoint(tmp_path / "a", _weights(0))
    b = _checkpoint(tmp_path / "b", _weights(1))
    data = (b / "model.safetensors").read_bytes()
    (b / "model.safetensors").write_bytes(data[:cut])
    with pytest.raises(SystemExit) as exit_info:
        main(["--inputs", str(a), str(b), "--output", str(tmp_path / "out")])
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert str(b / "model.safetensors") in err and ("truncated" in err or "empty" in err)
    assert "Traceback" not in err
