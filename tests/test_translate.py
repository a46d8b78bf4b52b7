"""`vaswani-mt translate` and its core, `translate_lines`."""

import io
import os
import sys

import pytest
import torch
from tiny_tokenizer import SENTENCES

from vaswani_mt import VaswaniForConditionalGeneration
from vaswani_mt.cli.translate import main
from vaswani_mt.inference.translate import translate_lines
from vaswani_mt.model import fast_decoding


def echo_generate(calls):
    """A stand-in for model.generate that 'translates' a sentence into itself (decoder start + source ids) and
    records each batch's source lengths."""
    def generate(input_ids, attention_mask, **kwargs):
        calls.append(attention_mask.sum(1).tolist())
        start = torch.full((input_ids.shape[0], 1), 2, dtype=torch.long)
        return torch.cat([start, input_ids], dim=1)
    return generate


def test_output_keeps_input_order_while_batches_are_length_sorted_within_the_token_budget(
        model, tokenizer, monkeypatch):
    calls = []
    monkeypatch.setattr(model, "generate", echo_generate(calls))
    lines = ["a", "a dog runs in the park .", "", "two men are playing football on the grass .", "a man .",
             "children play in the snow .", "   "] * 3
    out = list(translate_lines(model, tokenizer, lines, max_tokens=40, sort_window=7))
    assert out == [tokenizer.decode(tokenizer(t).input_ids, skip_special_tokens=True) if t.strip() else ""
                   for t in lines]
    assert len(calls) > 3
    for lengths in calls:
        assert len(lengths) * max(lengths) <= 40 or len(lengths) == 1  # padded tokens within budget
    lengths_per_window = [length for lengths in calls[: len(calls) // 3] for length in lengths]
    assert lengths_per_window == sorted(lengths_per_window, reverse=True)  # longest first inside a window


def test_translations_equal_generate_of_each_sentence(model, tokenizer):
    out = list(translate_lines(model, tokenizer, SENTENCES[:4], max_tokens=30, num_beams=1, max_new_tokens=6))
    expected = [tokenizer.decode(model.generate(**tokenizer([s], return_tensors="pt"), num_beams=1,
                                                max_new_tokens=6)[0], skip_special_tokens=True)
                for s in SENTENCES[:4]]
    assert out == expected


def test_a_100k_line_input_streams_holding_at_most_one_window(model, tokenizer, monkeypatch):
    monkeypatch.setattr(model, "generate", echo_generate([]))
    window, total = 500, 100_000
    read = 0

    def lines():
        nonlocal read
        for i in range(total):
            read += 1
            yield "a dog ." if i % 3 else "the cat sleeps ."

    written = 0
    for translation in translate_lines(model, tokenizer, lines(), max_tokens=2048, sort_window=window):
        written += 1
        assert read - written < window  # never more than one window of lines in flight
        assert translation in ("a dog .", "the cat sleeps .")
    assert written == read == total


def test_main_translates_files_and_prints_bleu_and_chrf_with_signatures_against_a_reference(
        model_dir, tmp_path, capsys):
    source, hypotheses, reference = tmp_path / "in.txt", tmp_path / "out.txt", tmp_path / "ref.txt"
    source.write_text("\n".join(SENTENCES[:3] + [""] + SENTENCES[3:5]) + "\n", encoding="utf-8")
    reference.write_text("\n".join(SENTENCES[:3] + [""] + SENTENCES[3:5]) + "\n", encoding="utf-8")
    code = main([str(model_dir), "--input", str(source), "--output", str(hypotheses), "--num-beams", "1",
                 "--max-new-tokens", "5", "--reference", str(reference), "--max-tokens", "20"])
    assert code == 0
    lines = hypotheses.read_text(encoding="utf-8").split("\n")
    assert len(lines) == 7 and lines[3] == "" and lines[-1] == ""
    from vaswani_mt.metrics import corpus_scores

    scores = corpus_scores(lines[:-1], SENTENCES[:3] + [""] + SENTENCES[3:5])
    err = capsys.readouterr().err
    assert f"BLEU = {scores['bleu']:.2f}" in err and "nrefs:1|case:mixed" in err
    assert f"chrF2 = {scores['chrf']:.2f}" in err and scores["chrf_signature"] in err


def test_length_penalty_options_reach_generate_and_otherwise_the_models_defaults_decide(model_dir, tmp_path,
                                                                                        monkeypatch):
    seen = []
    generate = VaswaniForConditionalGeneration.generate

    def spy(self, *args, **kwargs):
        if not fast_decoding._checking.get():  # not the check model the fast loops decode once per kind of model
            seen.append({key: kwargs[key] for key in ("length_penalty", "length_penalty_style") if key in kwargs})
        return generate(self, *args, **kwargs)

    monkeypatch.setattr(VaswaniForConditionalGeneration, "generate", spy)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    common = [str(model_dir), "-i", str(source), "-o", str(tmp_path / "out.txt"), "--num-beams", "2",
              "--max-new-tokens", "4"]
    assert main([*common, "--length-penalty", "1.5", "--length-penalty-style", "gnmt"]) == 0
    assert seen and all(call == {"length_penalty": 1.5, "length_penalty_style": "gnmt"} for call in seen)
    seen.clear()
    assert main(common) == 0
    assert seen and all(call == {} for call in seen)


def test_an_unknown_length_penalty_style_is_refused_by_the_command_line(model_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(model_dir), "--length-penalty-style", "gnm"])
    assert exit_info.value.code == 2 and "invalid choice: 'gnm'" in capsys.readouterr().err


def test_cli_reads_stdin_and_writes_stdout_without_a_progress_bar_when_not_on_a_terminal(
        model, tokenizer, model_dir, monkeypatch, capsys):
    text = "\n".join(SENTENCES[:2] + ["", SENTENCES[2]])  # no final newline: the last line still counts
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(text.encode())))
    assert main([str(model_dir), "--num-beams", "1", "--max-new-tokens", "3"]) == 0
    captured = capsys.readouterr()
    expected = list(translate_lines(model, tokenizer, SENTENCES[:2] + ["", SENTENCES[2]], num_beams=1,
                                    max_new_tokens=3))
    assert captured.out == "".join(line + "\n" for line in expected)
    assert "translating" not in captured.err


def test_missing_model_folder_is_a_clear_error(tmp_path, capsys):
    assert main([str(tmp_path / "nope"), "--input", os.devnull]) == 1
    assert "does not exist" in capsys.readouterr().err
    assert main([str(tmp_path), "--input", os.devnull]) == 1
    assert "no config.json" in capsys.readouterr().err
    (tmp_path / "config.json").write_text("{}")
    assert main([str(tmp_path), "--input", os.devnull]) == 1
    assert "no tokenizer" in capsys.readouterr().err


def test_non_utf8_input_names_the_line(model_dir, tmp_path, capsys):
    source = tmp_path / "latin1.txt"
    source.write_bytes("a dog .\nthe cat .\nzwei M\u00e4nner .\n".encode("latin-1"))
    assert main([str(model_dir), "--input", str(source), "--output", str(tmp_path / "o"), "--num-beams", "1",
                 "--max-new-tokens", "2"]) == 1
    err = capsys.readouterr().err
    assert "line 3 is not valid UTF-8" in err and "latin1.txt" in err
    assert main([str(model_dir), "--input", str(tmp_path / "missing.txt")]) == 1
    assert "cannot read input" in capsys.readouterr().err


def test_reference_with_a_different_line_count_is_refused(model_dir, tmp_path, capsys, monkeypatch):
    source, reference = tmp_path / "in.txt", tmp_path / "ref.txt"
    source.write_text("a dog .\nthe cat .\n", encoding="utf-8")
    reference.write_text("ein hund .\n", encoding="utf-8")
    assert main([str(model_dir), "--input", str(source), "--reference", str(reference)]) == 1
    assert "has 1 lines but --input" in capsys.readouterr().err
    # From stdin the count is only known at the end.
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(b"a dog .\nthe cat .\n")))
    assert main([str(model_dir), "--reference", str(reference), "--num-beams", "1", "--max-new-tokens", "2"]) == 1
    assert "has 1 lines but the input had 2" in capsys.readouterr().err


def test_a_progress_bar_is_shown_when_stderr_is_a_terminal(model_dir, tmp_path, monkeypatch):
    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    source = tmp_path / "in.txt"
    source.write_text("\n".join(SENTENCES[:3]) + "\n", encoding="utf-8")
    assert main([str(model_dir), "--input", str(source), "--output", str(tmp_path / "out.txt"), "--num-beams", "1",
                 "--max-new-tokens", "2"]) == 0
    assert "translating" in terminal.getvalue() and "3/3" in terminal.getvalue()


# --- faults (issue #12): one clear line, and nothing a user typed destroys a file ----------------------------------


def test_translate_refuses_to_overwrite_its_input(model_dir, tmp_path, capsys, monkeypatch):
    source = tmp_path / "in.txt"
    source.write_text("a dog .\nthe cat .\n", encoding="utf-8")
    link = tmp_path / "same-inode.txt"
    os.link(source, link)
    for output in (source, tmp_path / "." / "in.txt", link):
        assert main([str(model_dir), "-i", str(source), "-o", str(output)]) == 1
        assert "is the same file as --input" in capsys.readouterr().err
    with open(source, encoding="utf-8") as stdin:  # vaswani-mt translate MODEL -o in.txt < in.txt
        monkeypatch.setattr(sys, "stdin", stdin)
        assert main([str(model_dir), "-o", str(source)]) == 1
    assert "is the same file as stdin" in capsys.readouterr().err
    assert source.read_text(encoding="utf-8") == "a dog .\nthe cat .\n"


def test_translate_refuses_to_overwrite_its_reference_or_a_file_of_the_model(model_dir, tmp_path, capsys):
    source, reference = tmp_path / "in.txt", tmp_path / "ref.txt"
    source.write_text("a dog .\n", encoding="utf-8")
    reference.write_text("ein hund .\n", encoding="utf-8")
    assert main([str(model_dir), "-i", str(source), "-r", str(reference), "-o", str(reference)]) == 1
    assert "is the same file as --reference" in capsys.readouterr().err
    assert reference.read_text(encoding="utf-8") == "ein hund .\n"
    config = (model_dir / "config.json").read_bytes()
    assert main([str(model_dir), "-i", str(source), "-o", str(model_dir / "config.json")]) == 1
    assert "is a file of the model folder" in capsys.readouterr().err
    assert (model_dir / "config.json").read_bytes() == config


def test_max_new_tokens_beyond_the_models_positions_is_clamped_with_one_warning(model, tokenizer, tmp_path, caplog):
    limit = model.config.max_position_embeddings
    out = list(translate_lines(model, tokenizer, SENTENCES[:3], num_beams=1, max_new_tokens=limit + 172,
                               suppress_tokens=[tokenizer.eos_token_id], sort_window=1))  # no early end
    assert len(out) == 3
    warnings = [r.getMessage() for r in caplog.records if "max_new_tokens" in r.getMessage()]
    assert warnings == [f"max_new_tokens {limit + 172} is more than the model can hold "
                        f"(max_position_embeddings={limit}): translations stop at {limit} tokens"]


@pytest.mark.parametrize("damage", ["empty", "truncated", "deleted"])
def test_a_model_folder_with_broken_weights_is_named_not_a_library_traceback(model_dir, tmp_path, capsys, damage):
    weights = model_dir / "model.safetensors"
    if damage == "deleted":
        weights.unlink()
    else:
        weights.write_bytes(b"" if damage == "empty" else weights.read_bytes()[:1000])
    assert main([str(model_dir), "--input", os.devnull]) == 1
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "Traceback" not in err
    assert ("model.safetensors" in err) and ({"empty": "is empty", "truncated": "is truncated",
                                               "deleted": "no model weights"}[damage] in err)


@pytest.mark.parametrize("device", ["nonsense", "cuda:7"])
def test_an_unusable_device_is_refused_in_one_line(model_dir, capsys, device):
    if device.startswith("cuda") and torch.cuda.device_count() > 7:
        pytest.skip("this machine has a cuda:7")
    assert main([str(model_dir), "--input", os.devnull, "--device", device]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"vaswani-mt translate: error: device {device!r} cannot be used") and err.count("\n") == 1


def test_apples_gpu_where_torch_cannot_use_it_is_refused_in_one_line_naming_why(model_dir, capsys, monkeypatch):
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: False)
    assert main([str(model_dir), "--input", os.devnull, "--device", "mps"]) == 1
    assert capsys.readouterr().err == ("vaswani-mt translate: error: device 'mps' cannot be used: this torch was built "
                                       "without MPS (Apple's GPUs: torch for macOS on Apple silicon)\n")
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: False)
    assert main([str(model_dir), "--input", os.devnull, "--device", "mps"]) == 1
    assert "MPS is not available on this machine" in capsys.readouterr().err


def test_translate_and_the_demo_use_apples_gpu_by_default_where_there_is_no_cuda(monkeypatch):
    from vaswani_mt.inference.translate import usable_device

    placed = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(torch.backends.mps, "is_built", lambda: True)
    monkeypatch.setattr(torch.backends.mps, "is_available", lambda: True)
    monkeypatch.setattr(torch, "empty", lambda *args, device=None, **kwargs: placed.append(device))  # a Mac's GPU
    assert usable_device(None) == "mps" and placed == ["mps"]
    assert usable_device("cpu") == "cpu"


def test_a_full_disk_is_reported_with_the_output_file(model_dir, tmp_path, capsys, monkeypatch):
    import errno

    from vaswani_mt.cli import translate

    class FullDisk(io.StringIO):
        def write(self, text):
            raise OSError(errno.ENOSPC, "No space left on device")

    def fake_open(path, mode="r", *args, **kwargs):
        return FullDisk() if "w" in mode else open(path, mode, *args, **kwargs)

    monkeypatch.setattr(translate, "open", fake_open, raising=False)
    source, output = tmp_path / "in.txt", tmp_path / "out.txt"
    source.write_text("a dog .\n", encoding="utf-8")
    assert main([str(model_dir), "-i", str(source), "-o", str(output), "--num-beams", "1",
                 "--max-new-tokens", "2"]) == 1
    assert capsys.readouterr().err.endswith(f"\nvaswani-mt translate: error: no space left on device: {output}\n")


def test_translate_stops_quietly_when_the_reader_of_its_output_goes_away(model_dir, tmp_path):
    """`vaswani-mt translate MODEL < big.txt | head -1`: exit status 141 (SIGPIPE's, as Unix tools), no traceback."""
    import subprocess

    source = tmp_path / "in.txt"
    source.write_text("a dog .\n" * 3000, encoding="utf-8")
    with open(source, "rb") as stdin:
        process = subprocess.Popen([sys.executable, "-m", "vaswani_mt.cli", "translate", str(model_dir),
                                    "--num-beams", "1", "--max-new-tokens", "3"], stdin=stdin,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   env={**os.environ, "OMP_NUM_THREADS": "1"})
        process.stdout.readline()
        process.stdout.close()  # what `head -1` does after its line
        stderr = process.stderr.read().decode()
        assert process.wait(timeout=120) == 141, stderr[-2000:]  # stderr says why when it is not
    assert "Traceback" not in stderr and "BrokenPipe" not in stderr, stderr


def test_translate_help_names_the_model_folder_train_writes_and_ctranslate2_exports(capsys):
    with pytest.raises(SystemExit):
        main(["--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "runs/NAME/model" in help_text and "runs/NAME/final" not in help_text
    assert "CTranslate2 export" in help_text
