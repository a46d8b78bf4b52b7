"""The page of `vaswani-mt demo` without a browser (skipped where gradio is not installed): it builds, its handlers
show what `vaswani_mt.inference.demo` computes, bad input is one message in the page, the command refuses bad
options with one line, serves on 127.0.0.1 and stops on Ctrl+C, and the Space's app.py serves the same page.
The browser drives it in test_demo_browser.py (`pytest -m browser`)."""

import json
import runpy
import socket
import urllib.request

import pytest

gr = pytest.importorskip("gradio")
pytest.importorskip("matplotlib")

from demo_server import free_port, serving  # noqa: E402
from PIL import Image  # noqa: E402
from test_demo import EOS, stopping_model  # noqa: E402
from tiny_tokenizer import SENTENCES  # noqa: E402

from vaswani_mt.cli import main  # noqa: E402
from vaswani_mt.inference.demo import EMPTY_TEXT, translate_nbest  # noqa: E402
from vaswani_mt.inference.demo_app import AVERAGE, DemoHandlers, build_demo, nbest_rows  # noqa: E402
from vaswani_mt.publishing.hub import demo_files  # noqa: E402

ELEMENTS = {"source", "num-beams", "length-penalty", "max-length", "translate", "message", "translation",
            "model-input", "hypothesis", "kind", "layer", "head", "heatmap", "nbest"}


@pytest.fixture
def model(tokenizer):
    return stopping_model(tokenizer)


def components(demo) -> dict:
    return {c["props"]["elem_id"]: c for c in demo.get_config_file()["components"] if c["props"].get("elem_id")}


def test_the_page_has_its_inputs_outputs_and_one_public_translate_endpoint(model, tokenizer):
    demo = build_demo(model, tokenizer, name="tiny")
    found = components(demo)
    config = demo.get_config_file()
    assert ELEMENTS <= set(found)
    assert found["model-input"]["props"]["visible"] is False  # this model reads raw text
    assert found["num-beams"]["props"]["value"] == 4 and found["length-penalty"]["props"]["value"] == 0.6
    assert found["max-length"]["props"]["value"] == 0 and found["max-length"]["props"]["maximum"] == 128
    assert [d["api_name"] for d in config["dependencies"] if d["api_visibility"] == "public"] == ["translate"]
    assert config["analytics_enabled"] is False
    about = found["about"]["props"]["value"]
    assert "2+2 layers, 4 heads, d_model 32, 128 subwords, at most 128 tokens per sentence" in about
    assert "Decoding defaults: beam 4, length penalty 0.6 (score = log P / length ** 0.6)" in about


def test_translating_shows_the_translations_the_nbest_list_and_a_heatmap(model, tokenizer):
    handlers = DemoHandlers(model, tokenizer)
    text = f"{SENTENCES[0]}\n\n{SENTENCES[1]}"
    message, translations, model_input, rows, picker, results, image = handlers.translate(
        text, 3, 0.6, 0, "encoder-decoder", 1, AVERAGE)
    expected = translate_nbest(model, tokenizer, text, num_beams=3, length_penalty=0.6)

    assert message.startswith("2 sentences translated in ") and message.endswith(" s, 3 hypotheses each.")
    assert translations.split("\n") == [expected[0].translation, "", expected[1].translation]
    assert model_input.split("\n") == [SENTENCES[0], "", SENTENCES[1]]
    assert rows == nbest_rows(expected)
    assert rows[0][:2] == [1, 1] and rows[3][:2] == [3, 1]
    assert rows[0][3:5] == [f"{expected[0].hypotheses[0].log_prob:.3f}", f"{expected[0].hypotheses[0].score:.3f}"]
    assert [h.token_ids for r in results for h in r.hypotheses] == [h.token_ids for r in expected
                                                                     for h in r.hypotheses]
    assert picker.value == "0:1" and len(picker.choices) == 6
    assert picker.choices[4][1] == "1:2" and picker.choices[4][0].startswith("line 3, #2 (")
    assert isinstance(image, Image.Image) and image.width > 200 and image.height > 150


def test_empty_text_and_a_too_long_sentence_are_one_message_and_clear_the_outputs(tokenizer):
    handlers = DemoHandlers(stopping_model(tokenizer, max_position_embeddings=16), tokenizer)
    for text, expected in (("  \n ", EMPTY_TEXT), ("dog " * 30, "Line 1 is ")):
        message, translations, model_input, rows, picker, results, image = handlers.translate(
            text, 4, 0.6, 0, "encoder-decoder", 1, AVERAGE)
        assert message.startswith(f"**{expected}")
        assert (translations, model_input, rows, results, image, picker.choices) == ("", "", [], [], None, [])
    assert "(max_position_embeddings = 16 tokens)" in message


def test_every_kind_layer_and_head_of_a_hypothesis_is_drawn(model, tokenizer):
    handlers = DemoHandlers(model, tokenizer)
    results = translate_nbest(model, tokenizer, SENTENCES[2], num_beams=2)
    images = {(kind, head): handlers.draw(results, "0:2", kind, 0, head)
              for kind in ("encoder-decoder", "encoder-self", "decoder-self") for head in (AVERAGE, "1")}
    assert all(isinstance(image, Image.Image) for image in images.values())
    assert len({image.tobytes() for image in images.values()}) == 6
    assert handlers.draw([], None, "encoder-decoder", 0, AVERAGE) is None  # nothing translated yet
    layers, heads, image = handlers.kind_changed(results, "0:1", "encoder-self", 1, "3")
    assert layers.choices == [("0", 0), ("1", 1)] and layers.value == 1
    assert heads.value == "3" and heads.choices[0] == ("average of heads", AVERAGE)
    assert isinstance(image, Image.Image)


def test_a_model_trained_on_preprocessed_text_shows_what_it_reads(model, tokenizer):
    model.config.preprocess, model.config.source_lang = "lowercase_moses", "en"
    found = components(build_demo(model, tokenizer))
    assert found["model-input"]["props"]["visible"] is True
    assert found["model-input"]["props"]["label"] == "What the model reads (lowercased and Moses-tokenized)"
    assert "This model reads lowercased and Moses-tokenized text" in found["about"]["props"]["value"]
    _, _, model_input, rows, *_ = DemoHandlers(model, tokenizer).translate(
        "A Dog's ball, in the Park!", 2, 0.6, 0, "encoder-decoder", 1, AVERAGE)
    assert model_input == "a dog 's ball , in the park !"
    assert len(rows) == 2


def test_the_spaces_app_py_serves_the_model_beside_it_or_the_one_named(model_dir, tmp_path, monkeypatch):
    app = model_dir / "app.py"
    app.write_bytes(demo_files("alice/tiny")["app.py"])
    monkeypatch.delenv("VASWANI_MT_MODEL", raising=False)
    beside = runpy.run_path(str(app), run_name="space_app")  # not "__main__": built, not launched
    assert beside["MODEL"] == str(model_dir)
    assert isinstance(beside["demo"], gr.Blocks) and ELEMENTS <= set(components(beside["demo"]))
    elsewhere = tmp_path / "elsewhere" / "app.py"
    elsewhere.parent.mkdir()
    elsewhere.write_bytes(app.read_bytes())
    monkeypatch.setenv("VASWANI_MT_MODEL", str(model_dir))
    assert runpy.run_path(str(elsewhere), run_name="space_app")["MODEL"] == str(model_dir)
    assert 'else "alice/tiny")' in app.read_text()  # where nothing says otherwise: the repo it was pushed to


def test_the_demo_command_refuses_a_missing_folder_a_bad_device_and_a_taken_port_with_one_line(
        model_dir, tmp_path, capsys):
    assert main(["demo", str(tmp_path / "missing")]) == 2
    assert capsys.readouterr().err == f"vaswani-mt demo: error: model folder {tmp_path / 'missing'} does not exist\n"
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        capsys.readouterr()
        assert main(["demo", str(model_dir), "--port", str(port)]) == 1
        assert capsys.readouterr().err == (f"vaswani-mt demo: error: port {port} on 127.0.0.1 is in use: choose "
                                           "another with --port\n")
    assert main(["demo", str(model_dir), "--device", "cuda:7", "--port", str(free_port())]) == 2
    err = capsys.readouterr().err
    assert err.startswith("vaswani-mt demo: error: device 'cuda:7' cannot be used") and err.count("\n") == 1


def test_the_demo_command_serves_the_page_on_127_0_0_1_until_ctrl_c(model_dir, tmp_path):
    log = tmp_path / "demo.log"
    with serving(model_dir, log) as (url, process):
        with urllib.request.urlopen(url + "config", timeout=10) as response:
            config = json.loads(response.read())
        assert url.startswith("http://127.0.0.1:")
        assert config["title"] == f"vaswani-mt demo: {model_dir}"
        assert ELEMENTS <= {c["props"].get("elem_id") for c in config["components"]}
    assert process.returncode == 0, log.read_text()
    assert f"vaswani-mt demo: {model_dir} on {url.rstrip('/')} (on cpu); Ctrl+C stops it" in log.read_text()


def test_the_nbest_tokens_column_shows_each_hypothesis_subwords_up_to_its_end_of_sentence(model, tokenizer):
    results = translate_nbest(model, tokenizer, SENTENCES[0], num_beams=2)
    rows = nbest_rows(results)
    assert [row[5].split()[-1] for row in rows] == ["</s>", "</s>"]
    assert all(h.token_ids[-1] == EOS for h in results[0].hypotheses)
