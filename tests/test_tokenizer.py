"""The joint BPE tokenizer: fixed special ids, </s> at the end, lossless round trip, save/reload, speed."""

import json

import pytest
from datasets import Dataset, DatasetDict
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vaswani_mt.data.tokenization import byte_token, normalize_text, train_tokenizer

SMALL_CORPUS = [
    "A man in a blue shirt is standing on a ladder.",
    "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    "Two dogs play in the snow, while a child watches.",
    "Zwei Hunde spielen im Schnee, während ein Kind zusieht.",
    "The woman's hat is red; her coat is green!",
    "Der Hut der Frau ist rot; ihr Mantel ist grün!",
] * 5


def small_tokenizer(**kwargs):
    return train_tokenizer(SMALL_CORPUS, vocab_size=kwargs.pop("vocab_size", 400), min_frequency=1, **kwargs)


def round_trip(tokenizer, text):
    return tokenizer.decode(tokenizer(text)["input_ids"], skip_special_tokens=True)


def test_special_tokens_have_the_fixed_ids(multi30k_tokenizer):
    tok = multi30k_tokenizer
    assert isinstance(tok, PreTrainedTokenizerFast)
    assert (tok.pad_token, tok.unk_token, tok.bos_token, tok.eos_token) == ("<pad>", "<unk>", "<s>", "</s>")
    assert (tok.pad_token_id, tok.unk_token_id, tok.bos_token_id, tok.eos_token_id) == (0, 1, 2, 3)
    assert tok.convert_tokens_to_ids(["<pad>", "<unk>", "<s>", "</s>"]) == [0, 1, 2, 3]


def test_vocabulary_has_the_requested_size(multi30k_tokenizer):
    assert len(multi30k_tokenizer) == 8000
    assert multi30k_tokenizer.vocab_size == 8000


def test_encoding_ends_with_eos_and_does_not_start_with_bos(multi30k_tokenizer):
    ids = multi30k_tokenizer("Two young, White males are outside near many bushes.")["input_ids"]
    assert ids[-1] == 3
    assert ids.count(3) == 1
    assert 2 not in ids


def test_text_target_gives_labels_ending_in_eos(multi30k_tokenizer):
    encoded = multi30k_tokenizer(
        ["A dog runs.", "Two men are talking outside."],
        text_target=["Ein Hund rennt.", "Zwei Männer unterhalten sich draußen."],
    )
    assert set(encoded) == {"input_ids", "attention_mask", "labels"}
    for labels, source in zip(encoded["labels"], encoded["input_ids"]):
        assert labels[-1] == 3 and source[-1] == 3
        assert 2 not in labels
    assert multi30k_tokenizer.decode(encoded["labels"][1], skip_special_tokens=True) == (
        "Zwei Männer unterhalten sich draußen."
    )


def test_round_trip_is_exact_on_every_multi30k_valid_sentence(multi30k_dir, multi30k_tokenizer):
    # Raw files, not the cleaned dataset: the tokenizer itself must cope with U+00A0 (valid.de line 76).
    total = exact = 0
    failures = []
    for lang in ("en", "de"):
        lines = (multi30k_dir / f"valid.{lang}").read_text(encoding="utf-8").split("\n")[:-1]
        expected = [normalize_text(line) for line in lines]
        ids = multi30k_tokenizer(expected)["input_ids"]
        decoded = multi30k_tokenizer.batch_decode(ids, skip_special_tokens=True)
        raw_ids = multi30k_tokenizer(lines)["input_ids"]
        assert raw_ids == ids  # normalising first or letting the tokenizer do it is the same
        for want, got in zip(expected, decoded):
            total += 1
            exact += want == got
            if want != got:
                failures.append((want, got))
    share = exact / total
    print(f"\nround trip decode(encode(normalize(x))) == normalize(x) on Multi30k valid (en+de): "
          f"{exact}/{total} = {share:.2%}")
    assert total == 2028
    assert share == 1.0, failures[:5]


@pytest.mark.parametrize(
    "text",
    [
        "Hello , world . A space before punctuation stays .",
        'He said: "no" (twice) - and left... Ok?!',
        "Straße, Ärger, Öl, Übermut – „Zitat“ «Guillemets» 1,5 m.",
        "MIXED case and CamelCase and 1984 and 3.14",
        "Ein Mann, der (mit 2 Hunden) spazieren geht; sie bellen!",
    ],
)
def test_decode_gives_back_punctuation_spacing_casing_and_umlauts(multi30k_tokenizer, text):
    assert round_trip(multi30k_tokenizer, text) == text


def test_decode_does_not_clean_up_tokenization_spaces(multi30k_tokenizer):
    assert multi30k_tokenizer.clean_up_tokenization_spaces is False
    ids = multi30k_tokenizer("It is n't a dog 's toy , is it ?")["input_ids"]
    assert multi30k_tokenizer.decode(ids, skip_special_tokens=True) == "It is n't a dog 's toy , is it ?"


def test_normalize_text_maps_no_break_spaces_tabs_and_space_runs_to_single_spaces():
    assert normalize_text("  Nummer\u00a028\tund  \u2009mehr \n") == "Nummer 28 und mehr"
    assert normalize_text("ﬁne ＡＢＣ") == "fine ABC"  # NFKC compatibility forms
    assert normalize_text("Grüße") == "Grüße"
    assert normalize_text("") == ""


def test_tokenizer_applies_normalize_text_to_raw_input(multi30k_tokenizer):
    raw = "  Ein\u00a0Mann \t steht  da. "
    assert multi30k_tokenizer(raw)["input_ids"] == multi30k_tokenizer(normalize_text(raw))["input_ids"]
    assert round_trip(multi30k_tokenizer, raw) == normalize_text(raw) == "Ein Mann steht da."


def test_saved_tokenizer_normalizer_is_normalize_text(multi30k_tokenizer, tmp_path):
    multi30k_tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    samples = ["a\u00a0b", " x\u3000y\u2028z ", "ﬁ²", "\x1cq\x1fr", "tab\there", "Ärger  über\u202fdas"]
    for text in samples:
        assert reloaded.backend_tokenizer.normalizer.normalize_str(text) == normalize_text(text)
        assert normalize_text(text).split(" ") == normalize_text(text).split()  # agrees with str.split


def test_save_pretrained_and_autotokenizer_reload_give_identical_ids(multi30k_cleaned, multi30k_tokenizer, tmp_path):
    multi30k_tokenizer.save_pretrained(tmp_path)
    config = json.loads((tmp_path / "tokenizer_config.json").read_text())
    assert config["clean_up_tokenization_spaces"] is False
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    pairs = multi30k_cleaned[0]["valid"]["translation"][:200]
    sources, targets = [p["en"] for p in pairs], [p["de"] for p in pairs]
    original = multi30k_tokenizer(sources, text_target=targets)
    again = reloaded(sources, text_target=targets)
    assert again["input_ids"] == original["input_ids"]
    assert again["labels"] == original["labels"]
    assert (reloaded.pad_token_id, reloaded.unk_token_id, reloaded.bos_token_id, reloaded.eos_token_id) == (0, 1, 2, 3)
    assert reloaded.get_vocab() == multi30k_tokenizer.get_vocab()
    assert reloaded.batch_decode(again["labels"], skip_special_tokens=True) == targets
    assert reloaded("Ærø 😀")["input_ids"] == multi30k_tokenizer("Ærø 😀")["input_ids"]


def test_training_on_multi30k_train_takes_seconds(multi30k_tokenizer_training):
    seconds = multi30k_tokenizer_training.seconds
    print(f"\njoint BPE (vocab 8000) trained on Multi30k train, en+de, 57996 sentences: {seconds:.2f} s")
    assert seconds < 60


def test_training_is_deterministic(multi30k_cleaned, multi30k_tokenizer):
    again = train_tokenizer(multi30k_cleaned[0]["train"], vocab_size=8000)
    assert again.backend_tokenizer.to_str() == multi30k_tokenizer.backend_tokenizer.to_str()


def test_vocabulary_is_joint_over_both_languages(multi30k_tokenizer):
    vocab = multi30k_tokenizer.get_vocab()
    assert "▁the" in vocab and "▁und" in vocab  # frequent English and German words are whole pieces


def test_no_piece_joins_punctuation_to_letters_so_a_word_is_one_piece_before_a_comma_or_full_stop(
        multi30k_tokenizer):
    """As SentencePiece splits where the script changes: "bushes." is "▁bushes" + "." and shares "▁bushes" with the
    word elsewhere; a run of punctuation stays one pre-token."""
    pieces = multi30k_tokenizer.tokenize("Two young, White males are outside near many bushes.")
    assert pieces[:3] == ["▁Two", "▁young", ","] and pieces[-2:] == ["▁bushes", "."]
    assert not [p for p in multi30k_tokenizer.get_vocab()
                if any(c.isalpha() for c in p) and any(c in ",.;:!?" for c in p)]
    for text in ("Er sagt: „Hallo!“ ...", "The woman's hat -- red?!", "a , b . c", "T-Shirt, 3.5 m."):
        assert round_trip(multi30k_tokenizer, text) == text


def test_split_punctuation_false_splits_words_at_spaces_only():
    sentence = "Two dogs play in the snow, while a child watches."
    assert "w," in small_tokenizer(split_punctuation=False).tokenize(sentence)  # a piece across "snow,"
    assert "w," not in small_tokenizer().tokenize(sentence)
    assert round_trip(small_tokenizer(split_punctuation=False), "Der Hut ist rot; grün!") == "Der Hut ist rot; grün!"


def test_unseen_characters_round_trip_through_byte_fallback(multi30k_tokenizer):
    text = "Ærø, 😀 und 漢字 sind neu."
    assert "😀" not in "".join(multi30k_tokenizer.get_vocab())
    ids = multi30k_tokenizer(text)["input_ids"]
    assert 1 not in ids  # no <unk>
    assert multi30k_tokenizer.convert_tokens_to_ids(byte_token(0xF0)) in ids
    assert round_trip(multi30k_tokenizer, text) == text


def test_without_byte_fallback_unseen_characters_become_unk():
    tok = small_tokenizer(vocab_size=200, byte_fallback=False)
    assert byte_token(0x41) not in tok.get_vocab()
    ids = tok("A dog 😀")["input_ids"]
    assert 1 in ids and ids[-1] == 3
    assert "😀" not in round_trip(tok, "A dog 😀")


def test_files_strings_and_datasets_give_the_same_vocabulary(tmp_path):
    english, german = SMALL_CORPUS[0::2], SMALL_CORPUS[1::2]
    (tmp_path / "train.en").write_text("\n".join(english) + "\n", encoding="utf-8")
    (tmp_path / "train.de").write_text("\n".join(german) + "\n", encoding="utf-8")
    pairs = [{"en": e, "de": d} for e, d in zip(english, german)]
    from_strings = small_tokenizer()
    from_files = train_tokenizer([tmp_path / "train.en", str(tmp_path / "train.de")], vocab_size=400, min_frequency=1)
    from_dataset = train_tokenizer(Dataset.from_dict({"translation": pairs}), vocab_size=400, min_frequency=1)
    from_columns = train_tokenizer(
        Dataset.from_dict({"en": english, "de": german}), vocab_size=400, min_frequency=1, languages=["en", "de"]
    )
    expected = from_strings.get_vocab()
    for tok in (from_files, from_dataset, from_columns):
        assert tok.get_vocab() == expected


def test_dataset_dict_learns_from_the_train_split_only():
    train = Dataset.from_dict({"translation": [{"en": s, "de": s} for s in SMALL_CORPUS]})
    valid = Dataset.from_dict({"translation": [{"en": "Quixotic zephyrs", "de": "Quixotic zephyrs"}] * 50})
    tok = train_tokenizer(DatasetDict({"train": train, "valid": valid}), vocab_size=400, min_frequency=1)
    assert "▁Quixotic" not in tok.get_vocab()
    assert "Q" not in tok.get_vocab()  # not even its letters: valid text is never read


def test_truncation_keeps_eos_at_model_max_length():
    tok = small_tokenizer(model_max_length=8)
    ids = tok(" ".join(SMALL_CORPUS[:4]), truncation=True)["input_ids"]
    assert len(ids) == 8 and ids[-1] == 3


def test_bad_training_input_is_rejected_with_a_reason(tmp_path):
    with pytest.raises(ValueError, match="vocab_size=100 leaves no room"):
        train_tokenizer(SMALL_CORPUS, vocab_size=100)
    with pytest.raises(ValueError, match="corpus is empty"):
        train_tokenizer([], vocab_size=400)
    expected = r"language\(s\) \['fr'\] not in the 'translation' column; found \['de', 'en'\]"
    with pytest.raises(ValueError, match=expected):
        train_tokenizer(Dataset.from_dict({"translation": [{"en": "a", "de": "b"}]}), languages=["en", "fr"])
    with pytest.raises(FileNotFoundError, match="missing.txt"):
        train_tokenizer([tmp_path / "missing.txt"])
