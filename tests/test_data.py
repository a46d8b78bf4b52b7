"""Loading, cleaning and tokenising parallel corpora: sources, the cleaning rule, clear errors."""

import json
import logging
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from datasets import Dataset, DatasetDict

from vaswani_mt.data import cleaning as data_module
from vaswani_mt.data.cleaning import CleaningOptions, clean_parallel, load_parallel
from vaswani_mt.data.reading import DataError, read_parallel
from vaswani_mt.data.tokenization import normalize_text, train_tokenizer
from vaswani_mt.data.tokenizing import tokenize_dataset


def write_lines(path, lines):
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def write_corpus(folder, split, pairs, src="en", tgt="de"):
    write_lines(folder / f"{split}.{src}", [p[0] for p in pairs])
    write_lines(folder / f"{split}.{tgt}", [p[1] for p in pairs])


GOOD_PAIRS = [
    ("A dog runs on the grass.", "Ein Hund rennt über das Gras."),
    ("Two children play.", "Zwei Kinder spielen."),
    ("A woman reads a book.", "Eine Frau liest ein Buch."),
]


def translations(dataset, src="en", tgt="de"):
    return [(pair[src], pair[tgt]) for pair in dataset[:]["translation"]]


@pytest.fixture
def hub_must_not_be_called(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError(f"load_dataset was called with {args} {kwargs}")

    monkeypatch.setattr("datasets.load_dataset", refuse)


# --- Multi30k ---------------------------------------------------------------------------------------


def test_multi30k_folder_splits_are_discovered_with_a_translation_column(multi30k_cleaned):
    dataset, report = multi30k_cleaned
    assert list(dataset) == ["train", "test2016", "valid"]
    assert {split: len(ds) for split, ds in dataset.items()} == {"train": 28998, "test2016": 1000, "valid": 1014}
    for ds in dataset.values():
        assert ds.column_names == ["translation"]
    first = dataset["train"][0]["translation"]
    assert first == {
        "en": "Two young, White males are outside near many bushes.",
        "de": "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.",
    }


def test_multi30k_train_cleaning_drops_exactly_the_two_placeholder_pairs(multi30k_cleaned):
    dataset, report = multi30k_cleaned
    train = report["train"]
    print(f"\nMulti30k cleaning: {report.summary()}")
    assert (train.pairs_in, train.pairs_out) == (29000, 28998)
    assert train.dropped == {"placeholder": 2}
    assert all(de != "@@" for _, de in translations(dataset["train"]))


def test_multi30k_html_entities_are_unescaped(multi30k_cleaned):
    dataset, report = multi30k_cleaned
    pairs = translations(dataset["train"])
    assert not any("&amp" in en or "&amp" in de for en, de in pairs)
    assert any("Texas A&M" in en for en, _ in pairs)
    # 16 English lines have &amp;; the German lines 14875 (&amp;) and 14351 (&amp,) belong to those pairs.
    assert report["train"].html_unescaped == 16


def test_multi30k_whitespace_is_normalized_like_the_tokenizer(multi30k_cleaned):
    dataset, report = multi30k_cleaned
    for split in dataset:
        for en, de in translations(dataset[split]):
            for text in (en, de):
                assert text == normalize_text(text)
                assert "\u00a0" not in text and "\t" not in text and "  " not in text
                assert text == text.strip()
    # train.de: 44 no-break-space lines, 40 trailing-space lines, 44 double-space lines, 1 TAB; train.en: 1.
    assert report["train"].text_normalized == 130
    assert report["valid"].text_normalized == 1  # valid.de line 76 has a no-break space


def test_multi30k_valid_and_test_are_normalised_but_never_filtered(multi30k_cleaned):
    _, report = multi30k_cleaned
    for split in ("valid", "test2016"):
        assert report[split].filtered is False
        assert report[split].pairs_out == report[split].pairs_in
        assert report[split].dropped == {} and report[split].kept_despite == {}


def test_multi30k_report_is_returned_as_plain_counts(multi30k_cleaned):
    counts = multi30k_cleaned[1].to_dict()
    assert counts["train"]["dropped"] == {"placeholder": 2}
    assert json.loads(json.dumps(counts)) == counts


# --- The cleaning rule ------------------------------------------------------------------------------


def test_train_is_filtered_and_test_keeps_every_pair_with_a_warning(tmp_path, caplog):
    long_pair = (" ".join(["word"] * 30), " ".join(["Wort"] * 30))
    ratio_pair = ("One two three four five six seven eight nine ten.", "Eins.")
    bad = [("", "Leer."), ("@@", "Platzhalter."), long_pair, ratio_pair]
    write_corpus(tmp_path, "train", GOOD_PAIRS + bad)
    write_corpus(tmp_path, "test", GOOD_PAIRS + bad)
    options = CleaningOptions(max_length=20, max_ratio=3.0)
    with caplog.at_level(logging.INFO, logger="vaswani_mt.data.cleaning"):
        dataset, report = load_parallel(tmp_path, "en", "de", clean=options)
    assert translations(dataset["train"]) == GOOD_PAIRS
    assert report["train"].dropped == {"empty": 1, "placeholder": 1, "too_long": 1, "length_ratio": 1}
    assert len(dataset["test"]) == 7
    assert report["test"].dropped == {}
    assert report["test"].kept_despite == {"empty": 1, "placeholder": 1, "too_long": 1, "length_ratio": 1}
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert any("test: kept 4 pair(s)" in message for message in warnings)
    infos = [r.getMessage() for r in caplog.records if r.levelno == logging.INFO]
    assert any("train: 7 pairs read, 3 kept" in m and "placeholder 1" in m for m in infos)


def test_default_limits_follow_moses_clean_corpus(tmp_path):
    options = CleaningOptions()
    assert (options.max_length, options.length_unit, options.max_ratio) == (250, "words", 9.0)
    assert options.deduplicate is False and options.filter_splits == ("train",)
    ratio_9 = (" ".join(["w"] * 9), "x")
    ratio_10 = (" ".join(["w"] * 10), "x")
    too_long = (" ".join(["w"] * 251), " ".join(["x"] * 251))
    write_corpus(tmp_path, "train", [ratio_9, ratio_10, too_long])
    _, report = load_parallel(tmp_path, "en", "de")
    assert report["train"].dropped == {"too_long": 1, "length_ratio": 1}


def test_length_can_be_measured_in_characters(tmp_path):
    write_corpus(tmp_path, "train", [("abcdefghij", "abcdefghij"), ("abcdefghijk", "abcdefghij")])
    dataset, report = load_parallel(tmp_path, "en", "de", clean=CleaningOptions(max_length=10, length_unit="chars"))
    assert report["train"].dropped == {"too_long": 1}
    assert len(dataset["train"]) == 1


def test_duplicates_are_kept_by_default_and_dropped_when_asked(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS + [GOOD_PAIRS[0], (GOOD_PAIRS[1][0] + "  ", GOOD_PAIRS[1][1])])
    kept, _ = load_parallel(tmp_path, "en", "de")
    assert len(kept["train"]) == 5
    deduplicated, report = load_parallel(tmp_path, "en", "de", clean=CleaningOptions(deduplicate=True))
    assert translations(deduplicated["train"]) == GOOD_PAIRS  # the trailing-space copy is a duplicate once normalised
    assert report["train"].dropped == {"duplicate": 2}


def test_clean_false_leaves_the_text_untouched(tmp_path):
    raw = [("Texas A&amp;M  ", "@@"), ("a\u00a0b", "")]
    write_corpus(tmp_path, "train", raw)
    dataset, report = load_parallel(tmp_path, "en", "de", clean=False)
    assert translations(dataset["train"]) == raw
    assert report["train"].dropped == {} and report["train"].html_unescaped == 0


def test_only_complete_html_entities_are_unescaped():
    assert data_module.unescape_html("Texas A&amp;M &quot;Aggies&quot; &#39;92 &#x27;") == "Texas A&M \"Aggies\" '92 '"
    assert data_module.unescape_html("R&D this&nothing a&paragraph &bogus; &ampersand") == (
        "R&D this&nothing a&paragraph &bogus; &ampersand"
    )
    assert data_module.unescape_html("H&amp, R Block &lt &gt.") == "H&, R Block < >."


def test_clean_parallel_works_on_any_translation_dataset():
    raw = DatasetDict({"train": Dataset.from_dict({"translation": [{"de": "Ein&nbsp;Hund", "en": "A  dog"}]})})
    cleaned, report = clean_parallel(raw, "en", "de")
    assert cleaned["train"][0]["translation"] == {"en": "A dog", "de": "Ein Hund"}
    assert report["train"].html_unescaped == 1 and report["train"].text_normalized == 1


# --- Reading plain-text folders ----------------------------------------------------------------------


def test_only_the_requested_splits_are_loaded(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS)
    write_corpus(tmp_path, "valid", GOOD_PAIRS[:1])
    dataset, report = load_parallel(tmp_path, "en", "de", splits=["valid"])
    assert list(dataset) == ["valid"] and list(report.splits) == ["valid"]


def test_the_direction_follows_src_and_tgt_lang(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS)
    dataset, _ = load_parallel(tmp_path, "de", "en")
    assert translations(dataset["train"], "de", "en") == [(de, en) for en, de in GOOD_PAIRS]


def test_lines_split_only_on_newline_so_odd_separators_do_not_misalign(tmp_path):
    # str.splitlines() would break these lines in two (U+2028, U+0085, form feed) and misalign the sides.
    english = ["one\u2028line", "two\x0cline", "three\x85line", "crlf line"]
    (tmp_path / "train.en").write_bytes(("\n".join(english[:3]) + "\ncrlf line\r\n").encode())
    (tmp_path / "train.de").write_bytes("\ufeffeins\nzwei\ndrei\nvier\n".encode())  # with a byte-order mark
    dataset = read_parallel(tmp_path, "en", "de")
    assert translations(dataset["train"]) == list(zip(english, ["eins", "zwei", "drei", "vier"]))


def test_other_files_in_the_folder_are_ignored(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS)
    (tmp_path / "README.md").write_text("# notes\n")
    (tmp_path / "train.fr").write_text("Un chien.\n")  # another language is simply not asked for
    dataset, _ = load_parallel(tmp_path, "en", "de")
    assert list(dataset) == ["train"]


# --- Errors ------------------------------------------------------------------------------------------


def test_line_count_mismatch_names_the_longer_file_and_by_how_much(tmp_path):
    write_lines(tmp_path / "train.en", ["a", "b", "c", "d", "e"])
    write_lines(tmp_path / "train.de", ["a", "b", "c"])
    with pytest.raises(DataError) as error:
        load_parallel(tmp_path, "en", "de")
    message = str(error.value)
    assert "train.en has 5 lines but train.de has 3" in message
    assert "train.en is longer by 2 lines" in message
    assert str(tmp_path / "train.en") in message


def test_missing_split_file_is_named(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS)
    write_lines(tmp_path / "valid.en", ["a"])
    with pytest.raises(DataError, match=r"split 'valid': missing file\(s\) .*valid\.de"):
        load_parallel(tmp_path, "en", "de")
    with pytest.raises(DataError, match=r"split 'test': missing file\(s\) .*test\.en, .*test\.de"):
        load_parallel(tmp_path, "en", "de", splits=["train", "test"])


def test_non_utf8_file_error_names_the_file_and_line(tmp_path):
    write_lines(tmp_path / "train.en", ["one", "two", "three"])
    (tmp_path / "train.de").write_bytes("eins\nzwei\ndrei: Stra\xdfe\n".encode("latin-1"))
    with pytest.raises(DataError, match=r"train\.de is not valid UTF-8: line 3, byte column 11 \(byte 0xDF"):
        load_parallel(tmp_path, "en", "de")


def test_empty_file_error_names_the_file(tmp_path):
    write_lines(tmp_path / "train.en", ["one"])
    (tmp_path / "train.de").write_bytes(b"")
    with pytest.raises(DataError, match=r"train\.de is empty"):
        load_parallel(tmp_path, "en", "de")


def test_unknown_language_lists_the_languages_found(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS)
    with pytest.raises(DataError, match=r"unknown language 'fr': no '\*\.fr' files .*languages found: \['de', 'en'\]"):
        load_parallel(tmp_path, "en", "fr")


def test_same_source_and_target_language_is_an_error(tmp_path):
    write_corpus(tmp_path, "train", GOOD_PAIRS)
    with pytest.raises(DataError, match="both 'en'"):
        load_parallel(tmp_path, "en", "en")


def test_missing_local_path_is_an_error_not_a_hub_lookup(tmp_path, hub_must_not_be_called):
    for missing in (tmp_path / "nothing", str(tmp_path / "nothing"), "./data/corpus", "corpus.jsonl"):
        with pytest.raises(DataError, match="does not exist"):
            load_parallel(missing, "en", "de")


def test_folder_without_corpus_files_is_an_error(tmp_path):
    (tmp_path / "notes.txt").write_text("hello\n")
    with pytest.raises(DataError, match="holds neither"):
        load_parallel(tmp_path, "en", "de")


# --- JSON lines, CSV, Parquet -------------------------------------------------------------------------


def test_jsonl_rows_with_translation_dicts_or_language_keys(tmp_path):
    nested = tmp_path / "train.jsonl"
    nested.write_text("".join(json.dumps({"translation": {"en": e, "de": d}}) + "\n" for e, d in GOOD_PAIRS))
    flat = tmp_path / "valid.jsonl"
    flat.write_text("".join(json.dumps({"id": i, "en": e, "de": d}) + "\n" for i, (e, d) in enumerate(GOOD_PAIRS)))
    dataset, report = load_parallel({"train": nested, "valid": flat}, "en", "de")
    assert translations(dataset["train"]) == GOOD_PAIRS
    assert translations(dataset["valid"]) == GOOD_PAIRS
    single, _ = load_parallel(nested, "en", "de")  # one file is the train split
    assert list(single) == ["train"]
    folder, _ = load_parallel(tmp_path, "en", "de")  # a folder of {split}.jsonl files
    assert list(folder) == ["train", "valid"]


def test_json_array_file_is_accepted(tmp_path):
    path = tmp_path / "train.json"
    path.write_text(json.dumps([{"en": e, "de": d} for e, d in GOOD_PAIRS], indent=1))
    dataset, _ = load_parallel(path, "en", "de")
    assert translations(dataset["train"]) == GOOD_PAIRS


def test_jsonl_errors_name_the_line(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"en": "a", "de": "b"}\n{"en": "c", "de": \n')
    with pytest.raises(DataError, match=r"train\.jsonl: line 2 is not valid JSON"):
        load_parallel(path, "en", "de")
    path.write_text('{"en": "a", "de": "b"}\n{"en": "c", "de": null}\n')
    with pytest.raises(DataError, match=r"train\.jsonl line 2: the 'de' text is None, not a string"):
        load_parallel(path, "en", "de")
    path.write_text('{"translation": {"en": "a", "de": "b"}}\n')
    with pytest.raises(DataError, match=r"unknown language 'fr'; 'translation' languages found: \['de', 'en'\]"):
        load_parallel(path, "en", "fr")
    path.write_bytes(b'{"en": "a", "de": "b"}\n{"en": "\xff", "de": "b"}\n')
    with pytest.raises(DataError, match=r"train\.jsonl is not valid UTF-8: line 2"):
        load_parallel(path, "en", "de")
    path.write_text("\n")
    with pytest.raises(DataError, match=r"train\.jsonl is empty"):
        load_parallel(path, "en", "de")


def test_csv_and_tsv_with_language_columns(tmp_path):
    csv_path = tmp_path / "train.csv"
    csv_path.write_text('en,de\n"A dog, running.","Ein Hund, rennend."\nTwo cats.,Zwei Katzen.\n')
    tsv_path = tmp_path / "valid.tsv"
    tsv_path.write_text("de\ten\nEin Hund.\tA dog.\n")
    dataset, _ = load_parallel({"train": csv_path, "valid": tsv_path}, "en", "de")
    assert translations(dataset["train"]) == [("A dog, running.", "Ein Hund, rennend."), ("Two cats.", "Zwei Katzen.")]
    assert translations(dataset["valid"]) == [("A dog.", "Ein Hund.")]


def test_csv_errors_name_the_columns_and_rows(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("source,target\na,b\n")
    with pytest.raises(DataError, match=r"unknown language 'en'; columns found in the header: \['source', 'target'\]"):
        load_parallel(path, "en", "de")
    path.write_text("en,de\na,b\nc\n")
    with pytest.raises(DataError, match=r"train\.csv line 3: the row has fewer fields"):
        load_parallel(path, "en", "de")
    path.write_text("en,de\n")
    with pytest.raises(DataError, match="header but no rows"):
        load_parallel(path, "en", "de")


def test_parquet_with_translation_struct_or_language_columns(tmp_path):
    nested = tmp_path / "train.parquet"
    pq.write_table(pa.table({"translation": [{"en": e, "de": d} for e, d in GOOD_PAIRS]}), nested)
    flat = tmp_path / "test.parquet"
    pq.write_table(pa.table({"en": [e for e, _ in GOOD_PAIRS], "de": [d for _, d in GOOD_PAIRS]}), flat)
    dataset, _ = load_parallel({"train": nested, "test": flat}, "en", "de")
    assert translations(dataset["train"]) == GOOD_PAIRS
    assert translations(dataset["test"]) == GOOD_PAIRS
    with pytest.raises(DataError, match=r"unknown language 'fr'; columns found: \['en', 'de'\]"):
        load_parallel(flat, "fr", "de")
    pq.write_table(pa.table({"en": ["a", None], "de": ["b", "c"]}), flat)
    with pytest.raises(DataError, match=r"test\.parquet row 1: the 'en' text is None"):
        load_parallel(flat, "en", "de")


def test_unknown_split_in_a_file_dict_is_named(tmp_path):
    path = tmp_path / "train.jsonl"
    path.write_text('{"en": "a", "de": "b"}\n')
    with pytest.raises(DataError, match=r"split\(s\) \['valid'\] not found"):
        load_parallel({"train": path}, "en", "de", splits=["valid"])
    with pytest.raises(DataError, match=r"split 'valid': file .*valid\.jsonl does not exist"):
        load_parallel({"train": path, "valid": tmp_path / "valid.jsonl"}, "en", "de")


# --- Hugging Face Hub ids -----------------------------------------------------------------------------


def test_hub_id_is_loaded_with_load_dataset_and_cleaned(monkeypatch):
    calls = []

    def fake_load_dataset(name, config=None, **kwargs):
        calls.append((name, config, kwargs))
        pairs = [{"de": "Ein  Hund.", "en": "A dog.", "fr": "Un chien."}, {"de": "@@", "en": "Nothing."}]
        pairs[1]["fr"] = "Rien."
        return DatasetDict({
            "train": Dataset.from_dict({"translation": pairs}),
            "test": Dataset.from_dict({"translation": pairs}),
        })

    monkeypatch.setattr("datasets.load_dataset", fake_load_dataset)
    dataset, report = load_parallel("someone/parallel-corpus", "en", "de", hub_config="de-en", revision="main")
    assert calls == [("someone/parallel-corpus", "de-en", {"revision": "main"})]
    assert translations(dataset["train"]) == [("A dog.", "Ein Hund.")]
    assert dataset["train"][0]["translation"] == {"en": "A dog.", "de": "Ein Hund."}  # only the two languages
    assert report["train"].dropped == {"placeholder": 1}
    assert len(dataset["test"]) == 2 and report["test"].kept_despite == {"placeholder": 1}


def test_hub_dataset_with_language_columns(monkeypatch):
    monkeypatch.setattr(
        "datasets.load_dataset",
        lambda name, config=None, **kw: Dataset.from_dict({"en": ["A dog."], "de": ["Ein Hund."], "score": [0.9]}),
    )
    dataset, _ = load_parallel("corpus-id", "en", "de")
    assert list(dataset) == ["train"] and dataset["train"].column_names == ["translation"]
    assert translations(dataset["train"]) == [("A dog.", "Ein Hund.")]
    with pytest.raises(DataError, match=r"unknown language 'fr'; columns found: \['en', 'de', 'score'\]"):
        load_parallel("corpus-id", "en", "fr")


def test_hub_failure_says_the_source_was_taken_as_a_hub_id(monkeypatch):
    def offline(name, config=None, **kwargs):
        raise ConnectionError("offline")

    monkeypatch.setattr("datasets.load_dataset", offline)
    expected = "'owner/corpus' is not an existing local path, so it was loaded as a Hugging Face Hub dataset id"
    with pytest.raises(DataError, match=expected):
        load_parallel("owner/corpus", "en", "de")


# --- Tokenisation ------------------------------------------------------------------------------------


def test_tokenize_dataset_gives_unpadded_input_ids_and_labels_ending_in_eos(
    multi30k_tokenized, multi30k_cleaned, multi30k_tokenizer
):
    train = multi30k_tokenized["train"]
    assert train.column_names == ["input_ids", "labels"]
    assert len(train) == len(multi30k_cleaned[0]["train"])
    rows = train[:500]
    assert all(ids[-1] == 3 and 0 not in ids for ids in rows["input_ids"] + rows["labels"])
    assert len({len(ids) for ids in rows["input_ids"]}) > 5  # not padded to a common length
    pair = multi30k_cleaned[0]["train"][7]["translation"]
    expected = multi30k_tokenizer(pair["en"], text_target=pair["de"])
    assert train[7]["input_ids"] == expected["input_ids"] and train[7]["labels"] == expected["labels"]


def test_tokenize_dataset_truncates_to_max_length_keeping_eos_and_warns(tmp_path, caplog):
    write_corpus(tmp_path, "train", GOOD_PAIRS + [(" ".join(["dog"] * 40), "Hund")])
    dataset, _ = load_parallel(tmp_path, "en", "de", clean=CleaningOptions(max_ratio=None))
    tokenizer = train_tokenizer(dataset, vocab_size=300, min_frequency=1)
    with caplog.at_level(logging.WARNING, logger="vaswani_mt.data.tokenizing"):
        tokenized = tokenize_dataset(dataset, tokenizer, "en", "de", max_length=6, with_attention_mask=True)
    rows = tokenized["train"][:]
    assert max(len(ids) for ids in rows["input_ids"] + rows["labels"]) == 6
    assert all(ids[-1] == 3 for ids in rows["input_ids"] + rows["labels"])
    assert rows["attention_mask"] == [[1] * len(ids) for ids in rows["input_ids"]]
    assert any("train: truncated" in r.getMessage() for r in caplog.records)


def test_tokenize_dataset_needs_a_translation_column():
    tokenizer = train_tokenizer(["a b c"] * 5, vocab_size=280, min_frequency=1)
    with pytest.raises(DataError, match="no 'translation' column"):
        tokenize_dataset(Dataset.from_dict({"en": ["a"]}), tokenizer, "en", "de")


def test_data_error_is_a_value_error():
    assert issubclass(DataError, ValueError)
    assert data_module.DROP_REASONS == ("empty", "placeholder", "too_long", "length_ratio", "duplicate")


def test_a_training_split_emptied_by_the_cleaning_is_named_with_the_count_per_reason(tmp_path):
    write_corpus(tmp_path, "train", [("", "Leer."), ("@@", "Platzhalter."), ("@@", "Noch einer."),
                                     (" ".join(["word"] * 30), "Kurz.")])
    write_corpus(tmp_path, "valid", GOOD_PAIRS)
    with pytest.raises(DataError) as error:
        load_parallel(tmp_path, "en", "de", clean=CleaningOptions(max_length=20))
    assert str(error.value).startswith("split 'train' is empty after cleaning: all 4 pairs were dropped "
                                       "(empty: 1, placeholder: 2, too_long: 1)")


@pytest.mark.parametrize("suffix", [".jsonl", ".csv", ".tsv", ".parquet"])
def test_tabular_files_are_read_by_the_datasets_builders_into_memory_mapped_arrow_files(tmp_path, suffix):
    path = tmp_path / f"train{suffix}"
    if suffix == ".jsonl":
        path.write_text("".join(json.dumps({"translation": {"de": d, "en": e}}) + "\n" for e, d in GOOD_PAIRS))
    elif suffix == ".parquet":
        pq.write_table(pa.table({"en": [e for e, _ in GOOD_PAIRS], "de": [d for _, d in GOOD_PAIRS]}), path)
    else:
        separator = "\t" if suffix == ".tsv" else ","
        path.write_text(f"de{separator}en\n" + "".join(f'"{d}"{separator}"{e}"\n' for e, d in GOOD_PAIRS))
    dataset = read_parallel(path, "en", "de", cache_dir=tmp_path / "builders")["train"]
    assert translations(dataset) == GOOD_PAIRS
    assert dataset.cache_files and all(Path(f["filename"]).is_relative_to(tmp_path / "builders")
                                       for f in dataset.cache_files)


def test_csv_text_that_pandas_would_take_for_missing_values_is_kept_as_text(tmp_path):
    path = tmp_path / "train.csv"
    path.write_text("en,de\nNA,nan\nnull,\"\"\n")
    dataset = read_parallel(path, "en", "de", cache_dir=tmp_path / "builders")["train"]
    assert translations(dataset) == [("NA", "nan"), ("null", "")]
