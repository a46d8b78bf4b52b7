"""Offline BLEU/chrF: the bundled evaluate module and the plain scoring functions."""

import pytest
import sacrebleu

from vaswani_mt.metrics import METRIC_DIR, corpus_scores, load_metric, moses_tokenized_bleu

HYPOTHESES = [
    "A man in an orange hat starring at something.",
    "A Boston Terrier is running on lush green grass in front of a white fence.",
    "A girl in karate uniform breaking a stick with a front kick.",
]
REFERENCES = [
    "A man with an orange hat staring at something.",
    "A Boston terrier runs over bright green grass in front of a white fence.",
    "A girl in a karate uniform is breaking a stick with a front kick.",
]


@pytest.fixture
def offline(monkeypatch, tmp_path):
    """No Hub access; evaluate's metric cache_dir inside the test's temp dir."""
    import evaluate

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)
    return tmp_path


def test_metric_folder_follows_evaluates_local_layout():
    # evaluate.load(<dir>) runs <dir>/<dir name>.py
    assert (METRIC_DIR / f"{METRIC_DIR.name}.py").is_file()


def test_bundled_metric_loads_offline_and_equals_sacrebleu(offline):
    metric = load_metric(cache_dir=str(offline))
    result = metric.compute(predictions=HYPOTHESES, references=[[r] for r in REFERENCES])
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert result["bleu_signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert result["chrf_signature"].startswith("nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:")
    for detail in ("precisions", "counts", "totals", "bp", "sys_len", "ref_len"):
        assert detail in result


def test_bundled_metric_takes_plain_string_references_and_options(offline):
    metric = load_metric(cache_dir=str(offline))
    result = metric.compute(predictions=HYPOTHESES, references=REFERENCES, lowercase=True, tokenize="intl")
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES], lowercase=True, tokenize="intl")
    assert result["bleu"] == pytest.approx(expected.score, abs=1e-12)
    assert "case:lc" in result["bleu_signature"] and "tok:intl" in result["bleu_signature"]


def test_corpus_scores_use_sacrebleu_defaults():
    scores = corpus_scores(HYPOTHESES, REFERENCES)
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert scores["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score, abs=1e-12)
    assert "case:mixed" in scores["bleu_signature"] and "tok:13a" in scores["bleu_signature"]


def test_multiple_references_per_sentence_are_transposed_into_streams():
    second = ["A man wears an orange hat.", "A dog runs on grass.", "A girl kicks a stick."]
    scores = corpus_scores(HYPOTHESES, [list(pair) for pair in zip(REFERENCES, second)])
    assert scores["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, second]).score, abs=1e-12)
    assert scores["bleu_signature"].startswith("nrefs:2|")


def test_perfect_hypotheses_score_100():
    scores = corpus_scores(REFERENCES, REFERENCES)
    assert scores["bleu"] == pytest.approx(100.0) and scores["chrf"] == pytest.approx(100.0)


def test_moses_tokenized_bleu_is_100_for_identical_text():
    assert moses_tokenized_bleu(REFERENCES, REFERENCES, lang="en")["bleu"] == pytest.approx(100.0)


def test_moses_tokenized_bleu_forgives_case_and_tokenization_that_detokenized_bleu_counts():
    hypotheses = ["a boston terrier runs, in front of a white fence!"]
    references = ["A Boston Terrier runs , in front of a white fence !"]
    tokenized = moses_tokenized_bleu(hypotheses, references, lang="en")
    detokenized = corpus_scores(hypotheses, references)
    assert tokenized["bleu"] == pytest.approx(100.0)
    assert detokenized["bleu"] < 90.0  # 13a splits the punctuation too; case is what costs here
    assert "case:lc" in tokenized["bleu_signature"] and "tok:none" in tokenized["bleu_signature"]


def test_moses_tokenized_bleu_can_stay_cased():
    scores = moses_tokenized_bleu(["a dog runs ."], ["A dog runs."], lang="en", lowercase=False)
    assert scores["bleu"] < 100.0 and "case:mixed" in scores["bleu_signature"]


@pytest.mark.parametrize("score", [corpus_scores, lambda h, r: moses_tokenized_bleu(h, r, lang="de")])
def test_length_mismatch_names_both_counts(score):
    with pytest.raises(ValueError, match=r"3 hypotheses but 2 references"):
        score(HYPOTHESES, REFERENCES[:2])


def test_uneven_reference_counts_are_rejected():
    with pytest.raises(ValueError, match="same"):
        corpus_scores(HYPOTHESES[:2], [[REFERENCES[0]], [REFERENCES[1], REFERENCES[2]]])
