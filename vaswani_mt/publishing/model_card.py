"""Model cards (README.md) for trained vaswani_mt models.

* :func:`render_model_card` ``(run_dir, repo_id=None)``: the card of a run folder written by ``vaswani-mt train``
  (``config.yaml``, ``metrics.json``, ``model/``), as ``vaswani-mt push`` uploads it.
* :func:`trainer_model_card` ``(trainer)``: the card ``VaswaniTrainer.push_to_hub`` writes, from the trainer's state,
  the model's config and whatever run files exist.

The card is ``model_card_template.md`` (shipped inside the package) filled with facts. The YAML metadata has
``language``, ``license`` (+ ``license_name`` / ``license_link`` for ``other``), ``library_name: transformers``,
``pipeline_tag: translation``, ``tags``, ``datasets``, ``metrics`` and a ``model-index`` with the measured test
scores (the sacreBLEU signature in each metric's ``args``). Every number comes from the run: a metric the run did not
record is left out, never estimated.

Licence: the weights are derived from the training data, so the default licence is ``other`` with a name and link
describing the data's terms (Multi30k: non-commercial research and education). Pass ``license="apache-2.0"`` (or any
Hub licence id) when the data allows it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from importlib import resources
from pathlib import Path
from typing import Any

import yaml

from ..run_record import RunRecord

TEMPLATE_NAME = "model_card_template.md"
DEFAULT_TAGS = ["translation", "transformer", "vaswani_mt", "attention-is-all-you-need", "custom_code"]

LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}
# Example sentences for the card's code, in the languages Multi30k has (other languages fall back to English).
EXAMPLES = {
    "en": ["A dog runs across the grass.", "Two children are playing in the snow.",
           "A woman is riding a bicycle down the street.", "A man is cooking in a small kitchen."],
    "de": ["Ein Hund rennt über das Gras.", "Zwei Kinder spielen im Schnee.",
           "Eine Frau fährt mit dem Fahrrad die Straße entlang.", "Ein Mann kocht in einer kleinen Küche."],
    "fr": ["Un chien court sur l'herbe.", "Deux enfants jouent dans la neige.",
           "Une femme descend la rue à vélo.", "Un homme cuisine dans une petite cuisine."],
    "cs": ["Pes běží po trávě.", "Dvě děti si hrají ve sněhu.", "Žena jede na kole po ulici.",
           "Muž vaří v malé kuchyni."],
}

MULTI30K = {
    "label": "Multi30k",
    "license_name": "multi30k-non-commercial-research",
    "license_link": "https://github.com/multi30k/dataset",
    "terms": (
        "Multi30k is partly derived from Flickr30k, and its authors provide it \"solely for researchers and "
        "educators who wish to use the dataset for non-commercial research and/or educational purposes\" (the "
        "repository has no LICENSE file). Treat these weights the same way: use them only for non-commercial "
        "research or education."
    ),
    "domain": (
        "Multi30k holds short descriptions of Flickr photos (about 12 words each) and their translations. Expect "
        "good output only for short, literal, descriptive sentences. News, dialogue, technical text, long sentences "
        "and whole documents are out of domain. The captions carry their annotators' biases, for example gendered "
        "assumptions about people in the pictures, and the model reproduces them."
    ),
    "citation": """@inproceedings{elliott-etal-2016-multi30k,
  author    = {Elliott, Desmond and Frank, Stella and Sima'an, Khalil and Specia, Lucia},
  title     = {Multi30K: Multilingual English-German Image Descriptions},
  booktitle = {Proceedings of the 5th Workshop on Vision and Language},
  year      = {2016},
  publisher = {Association for Computational Linguistics},
  pages     = {70--74},
  doi       = {10.18653/v1/W16-3210}
}""",
}


# --- entry points ---------------------------------------------------------------------------------------------------

def render_model_card(run_dir, repo_id: str | None = None, *, license: str | None = None,  # noqa: A002
                      license_name: str | None = None, license_link: str | None = None,
                      dataset: str | None = None) -> str:
    """The README.md of a run folder written by ``vaswani-mt train`` (its `RunRecord`).

    `repo_id` ("user/name") names the model and goes into the usage code; without it the code reads
    ``"<namespace>/<name>"``. `license` is a Hub licence id; by default ``other``, described by `license_name` /
    `license_link` or, for known data (Multi30k), by the data's terms. `dataset` overrides the dataset id of the
    metadata (by default: ``data.path`` of the run config when it is a Hub id, else its folder name)."""
    return render_card(RunRecord.read(run_dir), repo_id=repo_id, license=license, license_name=license_name,
                       license_link=license_link, dataset=dataset)


def trainer_model_card(record: RunRecord, repo_id: str | None = None, language=None, license=None,  # noqa: A002
                       tags=None, model_name=None, dataset=None, dataset_tags=None, license_name=None,
                       license_link=None, **_ignored) -> str:
    """The card ``VaswaniTrainer.create_model_card`` writes, from `RunRecord.from_trainer`: the keyword arguments of
    ``Trainer.create_model_card`` (those without a place in this card are ignored), plus ``license_name`` /
    ``license_link``."""
    dataset = dataset or dataset_tags
    if isinstance(dataset, (list, tuple)):
        dataset = dataset[0] if dataset else None
    return render_card(record, repo_id=repo_id, license=license, license_name=license_name,
                       license_link=license_link, dataset=dataset, language=language, extra_tags=tags,
                       model_name=model_name)


# --- rendering ------------------------------------------------------------------------------------------------------

def load_template() -> str:
    return resources.files("vaswani_mt.publishing").joinpath(TEMPLATE_NAME).read_text(encoding="utf-8")


def fill_template(template: str, values: dict[str, Any]) -> str:
    """``{{ key }}`` -> value; ``{{#key}}...{{/key}}`` kept when the value is truthy, ``{{^key}}...{{/key}}`` when it
    is not; ``{{! ... !}}`` dropped. An unknown key raises `KeyError` (a template bug)."""
    text = re.sub(r"\{\{!.*?!\}\}\n?", "", template, flags=re.S)
    section = re.compile(r"\{\{([#^])(\w+)\}\}(.*?)\{\{/\2\}\}", re.S)
    while True:
        match = section.search(text)
        if match is None:
            break
        kind, key, body = match.groups()
        if key not in values:
            raise KeyError(f"model card template: unknown section {key!r}")
        keep = bool(values[key]) == (kind == "#")
        text = text[:match.start()] + (body if keep else "") + text[match.end():]

    def substitute(match):
        key = match.group(1)
        if key not in values:
            raise KeyError(f"model card template: unknown key {key!r}")
        return str(values[key])

    text = re.sub(r"\{\{\s*(\w+)\s*\}\}", substitute, text)
    return re.sub(r"\n{3,}", "\n\n", text).strip() + "\n"


def render_card(record: RunRecord, repo_id: str | None = None, license: str | None = None,  # noqa: A002
                license_name: str | None = None, license_link: str | None = None, dataset: str | None = None,
                language=None, extra_tags=None, model_name: str | None = None) -> str:
    """The card text of a run's record."""
    config = record.config
    metrics = record.to_json()
    metrics["validation"] = dataclasses.asdict(record.validation) if record.validation else {}
    data_cfg = config.get("data") or {}
    model_config = record.model_config or record.model.config
    generation = record.generation_config

    languages = _languages(language, data_cfg)
    source, target = (languages + [None, None])[:2] if len(languages) == 2 else (None, None)
    dataset_id = dataset or _dataset_id(data_cfg.get("path"))
    known = MULTI30K if _is_multi30k(dataset_id, data_cfg.get("path")) else None
    dataset_label = known["label"] if known else dataset_id
    name = model_name or (repo_id.split("/")[-1] if repo_id else record.name or "vaswani-mt-model")
    repo = repo_id or f"<namespace>/{name}"

    test = _measured_test(metrics.get("test") or {})
    meta_license, license_text = _license(license, license_name, license_link, known, dataset_label)
    metadata = _metadata(name, languages, meta_license, dataset_id, dataset_label, source, target, test,
                         extra_tags)

    values = {
        "metadata": yaml.safe_dump(metadata, sort_keys=False, allow_unicode=True, width=100).rstrip("\n"),
        "title": name,
        "task_phrase": _task_phrase(source, target, dataset_label),
        "shape_phrase": _shape_phrase(config, metrics, model_config),
        "headline": _headline(test, dataset_label),
        "snippet_generate": _snippet_generate(repo, source),
        "snippet_pipeline": _snippet_pipeline(repo, source),
        "snippet_finetune": _snippet_finetune(repo, source, target),
        "decoding_text": _decoding_text(generation),
        "results_table": _results_table(test),
        "results_note": _results_note(test, dataset_label),
        "selection_text": _selection_text(metrics.get("selection") or {}, metrics.get("validation") or {}),
        "architecture_table": _architecture_table(config, metrics, model_config),
        "data_text": _data_text(data_cfg, config.get("tokenizer") or {}, dataset_label, source, target,
                                model_config, bool(metrics.get("data"))),
        "cleaning_table": _cleaning_table(metrics.get("data") or {}),
        "recipe_table": _recipe_table(config.get("training") or {}),
        "run_table": _run_table(metrics.get("training") or {}, metrics.get("command")),
        "limitations": _limitations(known, dataset_label, model_config, test),
        "license_text": license_text,
        "data_citation": known["citation"] if known else "",
    }
    return fill_template(load_template(), values)


# --- facts -> text --------------------------------------------------------------------------------------------------

def _measured_test(test: dict) -> dict:
    """The test block with only the metrics that were measured (numbers, not None/NaN)."""
    out = {k: v for k, v in test.items() if v is not None}
    for key in ("bleu", "chrf", "bleu_lowercased_moses_tokenized"):
        value = out.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            out.pop(key, None)
    return out


TEST_METRICS = [  # (key in metrics.json "test", metric type, display name, signature key)
    ("bleu", "bleu", "BLEU (sacreBLEU: cased, 13a tokenization, detokenized output)", "bleu_signature"),
    ("chrf", "chrf", "chrF (sacreBLEU)", "chrf_signature"),
    ("bleu_lowercased_moses_tokenized", "bleu", "BLEU, lowercased and Moses-tokenized (sacreBLEU, tok:none)",
     "bleu_lowercased_moses_tokenized_signature"),
]


def _metadata(name, languages, meta_license, dataset_id, dataset_label, source, target, test, extra_tags) -> dict:
    from huggingface_hub import EvalResult
    from huggingface_hub.repocard_data import eval_results_to_model_index

    metadata: dict[str, Any] = {}
    if languages:
        metadata["language"] = languages
    metadata.update(meta_license)
    metadata["library_name"] = "transformers"
    metadata["pipeline_tag"] = "translation"
    tags = list(DEFAULT_TAGS)
    for tag in [extra_tags] if isinstance(extra_tags, str) else (extra_tags or []):
        if tag not in tags:
            tags.append(tag)
    metadata["tags"] = tags
    if dataset_id:
        metadata["datasets"] = [dataset_id]
    results = []
    if dataset_id and test:
        for key, metric_type, metric_name, signature_key in TEST_METRICS:
            if key not in test:
                continue
            args = {k: v for k, v in {"signature": test.get(signature_key), "num_beams": test.get("num_beams"),
                                      "sentences": test.get("sentences")}.items() if v is not None}
            results.append(EvalResult(
                task_type="translation",
                task_name=f"Translation {source}-{target}" if source else "Translation",
                dataset_type=dataset_id, dataset_name=dataset_label or dataset_id,
                dataset_config=f"{source}-{target}" if source else None,
                dataset_split=test.get("split"),
                metric_type=metric_type, metric_value=test[key], metric_name=metric_name,
                metric_args=args or None,
            ))
    if results:
        metadata["metrics"] = sorted({r.metric_type for r in results})
        metadata["model-index"] = eval_results_to_model_index(name, results)
    return metadata


def _license(license, license_name, license_link, known, dataset_label) -> tuple[dict, str]:  # noqa: A002
    data_terms = known["terms"] if known else (
        f"This card does not know the terms of the training data ({dataset_label or 'unknown'}); check them before "
        "you use or share these weights.")
    if license and license != "other":
        text = (f"The weights are released under `{license}`, as chosen by the uploader. The weights are derived from "
                f"the training data, so its terms still apply. {data_terms}")
        return {"license": license}, text + _code_license_note()
    fields = {"license": "other",
              "license_name": license_name or (known["license_name"] if known else "training-data-terms")}
    link = license_link or (known["license_link"] if known else None)
    if link:
        fields["license_link"] = link
    text = ("The licence is `other`. The weights are derived from the training data and are bound by its terms. "
            f"{data_terms}")
    if link:
        text += f" See {link}."
    if not known and not license_name:
        text += (" If the data allows it, re-upload with a licence, e.g. `vaswani-mt push ... --license "
                 "apache-2.0`.")
    return fields, text + _code_license_note()


def _code_license_note() -> str:
    return ("\n\nThe code files (`modeling_vaswani.py`, `configuration_vaswani.py`, `pipeline_vaswani.py`) come "
            "from vaswani_mt, under the Apache License 2.0.")


def _task_phrase(source, target, dataset_label) -> str:
    phrase = (f"{_language_name(source)}-to-{_language_name(target)} translation ({source} → {target})"
              if source else "machine translation")
    return phrase + (f" on {dataset_label}" if dataset_label else "")


def _shape_phrase(config, metrics, model_config) -> str:
    preset = (config.get("model") or {}).get("preset") or (metrics.get("model") or {}).get("preset")
    parts = []
    if model_config.get("encoder_layers") is not None and model_config.get("decoder_layers") is not None:
        parts.append(f"{model_config['encoder_layers']}+{model_config['decoder_layers']} layers")
    if model_config.get("d_model") is not None:
        parts.append(f"d_model {model_config['d_model']}")
    if model_config.get("encoder_attention_heads") is not None:
        parts.append(f"{model_config['encoder_attention_heads']} heads")
    parameters = (metrics.get("model") or {}).get("parameters")
    if parameters:
        parts.append(f"{_count(parameters)} parameters")
    if not parts and not preset:
        return ""
    lead = f"It is the `{preset}` preset" if preset else "Shape"
    return lead + (": " + ", ".join(parts) if parts else "") + "."


def _headline(test, dataset_label) -> str:
    scores = [f"{label} {test[key]:.2f}" for key, label in (("bleu", "BLEU"), ("chrf", "chrF")) if key in test]
    if not scores:
        return ""
    where = " on " + " ".join(p for p in (dataset_label, test.get("split")) if p) if (dataset_label or
                                                                                      test.get("split")) else ""
    details = [f"{test['sentences']:,} sentences" if "sentences" in test else None,
               f"beam {test['num_beams']}" if "num_beams" in test else None]
    details = ", ".join(d for d in details if d)
    return " and ".join(scores) + where + (f" ({details})" if details else "") + \
        ", scored with sacreBLEU; the signatures are listed under Results."


def _results_table(test) -> str:
    rows = []
    for key, _, metric_name, signature_key in TEST_METRICS:
        if key in test:
            signature = test.get(signature_key)
            # a "|" inside a table cell must be escaped, even within a code span (GitHub-flavoured Markdown)
            cell = "`" + signature.replace("|", "\\|") + "`" if signature else ""
            rows.append(f"| {metric_name} | {test[key]:.2f} | {cell} |")
    if not rows:
        return ""
    return "| Metric | Score | sacreBLEU signature |\n| --- | ---: | --- |\n" + "\n".join(rows)


def _results_note(test, dataset_label) -> str:
    parts = []
    where = " ".join(p for p in (dataset_label, test.get("split")) if p)
    if where:
        parts.append(f"Test set: {where}" + (f", {test['sentences']:,} sentences" if "sentences" in test else "")
                     + ".")
    if "num_beams" in test:
        parts.append(f"Beam search with {test['num_beams']} beams." if test["num_beams"] > 1 else "Greedy search.")
    parts.append("Scores are computed on detokenized output against the raw references.")
    if "seconds" in test:
        parts.append(f"Translating the test set took {test['seconds']} s.")
    parts.append("These scores are not comparable to the paper's WMT 2014 results, which come from different data.")
    return " ".join(parts)


def _selection_text(selection, validation) -> str:
    parts = []
    if selection.get("chosen") == "averaged" and selection.get("averaged_checkpoints"):
        names = ", ".join(selection["averaged_checkpoints"])
        text = (f"the weights are the average of the last {len(selection['averaged_checkpoints'])} checkpoints "
                f"({names}), as in §6.1")
        scores = []
        if selection.get("valid_bleu_averaged") is not None:
            scores.append(f"validation BLEU {selection['valid_bleu_averaged']:.2f}")
        if selection.get("valid_bleu_best_checkpoint") is not None:
            scores.append(f"{selection['valid_bleu_best_checkpoint']:.2f} for the best single checkpoint")
        parts.append(text + (f" ({', against '.join(scores)})" if scores else "") + ".")
    elif selection.get("chosen"):
        text = "the weights are those of the best checkpoint by validation BLEU"
        if selection.get("best_checkpoint"):
            text += f" (`{Path(selection['best_checkpoint']).name}`"
            if selection.get("valid_bleu_best_checkpoint") is not None:
                text += f", validation BLEU {selection['valid_bleu_best_checkpoint']:.2f}"
            text += ")"
        if selection.get("valid_bleu_averaged") is not None:
            text += (f"; the average of the last checkpoints scored lower "
                     f"({selection['valid_bleu_averaged']:.2f})")
        parts.append(text + ".")
    if validation.get("bleu") is not None:
        parts.append(f"The last evaluation during training (step {validation['step']}) gave validation BLEU "
                     f"{validation['bleu']:.2f}" + (f", chrF {validation['chrf']:.2f}" if validation.get("chrf")
                                                    is not None else "") + ".")
    return " ".join(parts)


def _architecture_table(config, metrics, model_config) -> str:
    m = model_config
    preset = (config.get("model") or {}).get("preset") or (metrics.get("model") or {}).get("preset")
    rows = [("Architecture", "encoder-decoder Transformer (§3)")]
    if preset:
        rows.append(("Preset", f"`{preset}`"))
    if "encoder_layers" in m:
        rows.append(("Layers (N)", f"{m['encoder_layers']} encoder, {m.get('decoder_layers', '?')} decoder"))
    for key, label in (("d_model", "d_model"),):
        if key in m:
            rows.append((label, str(m[key])))
    if "encoder_attention_heads" in m:
        heads = m["encoder_attention_heads"]
        dec = m.get("decoder_attention_heads", heads)
        rows.append(("Attention heads (h)", str(heads) if dec == heads else f"{heads} encoder, {dec} decoder"))
    if "encoder_ffn_dim" in m:
        ffn, dec = m["encoder_ffn_dim"], m.get("decoder_ffn_dim", m["encoder_ffn_dim"])
        rows.append(("Feed-forward (d_ff)", str(ffn) if dec == ffn else f"{ffn} encoder, {dec} decoder"))
    if "activation_function" in m:
        rows.append(("Activation", m["activation_function"]))
    for key, label in (("dropout", "Dropout (P_drop)"), ("attention_dropout", "Attention dropout"),
                       ("activation_dropout", "Activation dropout")):
        if key in m:
            rows.append((label, str(m[key])))
    if "norm_style" in m:
        rows.append(("Layer norm", {"post": "post-norm, LayerNorm(x + Sublayer(x)) as in the paper (§3.1)",
                                    "pre": "pre-norm, x + Sublayer(LayerNorm(x))"}.get(m["norm_style"],
                                                                                       m["norm_style"])))
    if "max_position_embeddings" in m:
        rows.append(("Positions", f"sinusoidal (§3.5), at most {m['max_position_embeddings']} tokens"))
    embedding = []
    if m.get("share_embeddings"):
        embedding.append("shared by source and target")
    if m.get("tie_word_embeddings"):
        embedding.append("tied to the output projection")
    if m.get("scale_embedding"):
        embedding.append("scaled by sqrt(d_model)")
    if embedding:
        rows.append(("Embeddings", ", ".join(embedding) + " (§3.4)"))
    if "vocab_size" in m:
        rows.append(("Vocabulary", f"{m['vocab_size']:,} tokens"))
    parameters = (metrics.get("model") or {}).get("parameters")
    if parameters:
        rows.append(("Parameters", f"{parameters:,}"))
    return _table(("Setting", "Value"), rows)


def _data_text(data_cfg, tokenizer_cfg, dataset_label, source, target, model_config, has_cleaning) -> str:
    sentences = []
    if dataset_label or source:
        text = f"Trained on {dataset_label or 'parallel data'}"
        if source:
            text += f" ({source} → {target})"
        path = data_cfg.get("path")
        if path and _dataset_id(path) == path:
            text += f", loaded from the Hub dataset `{path}`"
        sentences.append(text + ".")
    splits = [f"{role} `{data_cfg[key]}`" for key, role in (("train_split", "training"),
                                                              ("valid_split", "validation"),
                                                              ("test_split", "test")) if data_cfg.get(key)]
    if splits:
        sentences.append("Splits: " + ", ".join(splits) + ".")
    if data_cfg.get("max_length"):
        sentences.append(f"Training examples longer than {data_cfg['max_length']} tokens were truncated.")
    if data_cfg.get("drop_duplicates"):
        sentences.append("Exact duplicate training pairs were dropped.")
    if tokenizer_cfg:
        vocab = model_config.get("vocab_size") or tokenizer_cfg.get("vocab_size")
        if tokenizer_cfg.get("path"):
            sentences.append("The tokenizer was given to the run, not trained by it"
                             + (f"; it has {vocab:,} tokens." if vocab else "."))
        elif vocab:
            sentences.append(f"Tokenizer: a joint byte-pair-encoding vocabulary of {vocab:,} tokens, learned on the "
                             "training split of both languages (§5.1).")
    if sentences and has_cleaning:
        sentences.append("The run cleaned the text before training; the table below counts what the cleaning did.")
    return " ".join(sentences)


def _cleaning_table(cleaning) -> str:
    rows = []
    for split, report in cleaning.items():
        if not isinstance(report, dict):
            continue
        dropped = report.get("dropped") or {}
        dropped_text = str(sum(dropped.values())) if dropped else "0"
        if dropped:
            dropped_text += " (" + ", ".join(f"{reason}: {count}" for reason, count in dropped.items()) + ")"
        rows.append((f"`{split}`", _maybe(report.get("pairs_in"), "{:,}"), _maybe(report.get("pairs_out"), "{:,}"),
                     dropped_text if report.get("filtered", True) else "not filtered",
                     _maybe(report.get("html_unescaped")), _maybe(report.get("text_normalized"))))
    if not rows:
        return ""
    return _table(("Split", "Pairs read", "Pairs kept", "Dropped", "HTML entities unescaped", "Text normalized"),
                  rows)


def _recipe_table(training) -> str:
    t = training
    rows = []
    if "adam_beta1" in t:
        rows.append(("Optimizer", f"Adam, β1 = {t['adam_beta1']}, β2 = {t.get('adam_beta2')}, "
                                  f"ε = {t.get('adam_epsilon')} (§5.3)"))
    if "warmup_steps" in t:
        factor = t.get("noam_factor")
        rows.append(("Learning rate", f"Noam schedule, d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), "
                                      f"{t['warmup_steps']} warm-up steps"
                     + (f", factor {factor}" if factor not in (None, 1, 1.0) else "") + " (§5.3)"))
    if "label_smoothing" in t:
        rows.append(("Label smoothing", f"ε_ls = {t['label_smoothing']} (§5.4)"))
    if t.get("max_tokens"):
        batch = f"about {t['max_tokens']:,} tokens per side, sentences of similar length batched together (§5.1)"
        if t.get("gradient_accumulation_steps", 1) and t.get("gradient_accumulation_steps", 1) > 1:
            batch += f", × {t['gradient_accumulation_steps']} gradient accumulation"
        rows.append(("Batch", batch))
    elif t.get("per_device_train_batch_size"):
        rows.append(("Batch", f"{t['per_device_train_batch_size']} sentences per device"))
    if t.get("max_steps"):
        rows.append(("Length", f"at most {t['max_steps']:,} updates"
                     + (f" and {t['max_minutes']} minutes" if t.get("max_minutes") else "")))
    elif t.get("num_epochs"):
        rows.append(("Length", f"at most {t['num_epochs']} epochs"
                     + (f" and {t['max_minutes']} minutes" if t.get("max_minutes") else "")))
    if "weight_decay" in t:
        rows.append(("Weight decay", str(t["weight_decay"])))
    if "max_grad_norm" in t:
        rows.append(("Gradient clipping", f"max norm {t['max_grad_norm']}" if t["max_grad_norm"] else "none"))
    if t.get("eval_steps"):
        rows.append(("Validation", f"beam-search BLEU every {t['eval_steps']:,} updates"
                     + (f", beam {t['num_beams']}" if t.get("num_beams") else "")))
    if t.get("average_last") and t["average_last"] > 1:
        rows.append(("Checkpoint averaging", f"the last {t['average_last']} checkpoints, kept if better on "
                                             "validation (§6.1)"))
    if "bf16" in t:
        rows.append(("Precision", "bfloat16 autocast" if t["bf16"] else "float32"))
    if "seed" in t:
        rows.append(("Seed", str(t["seed"])))
    return _table(("Setting", "Value"), rows) if rows else ""


def _run_table(training, command) -> str:
    t = training
    rows = []
    if t.get("steps") is not None:
        rows.append(("Updates", f"{t['steps']:,}"))
    if t.get("epochs") is not None:
        rows.append(("Epochs", str(t["epochs"])))
    if t.get("train_runtime_seconds") is not None:
        rows.append(("Training time", _duration(t["train_runtime_seconds"]) + " (evaluations included)"))
    if t.get("target_tokens_per_second_median") is not None:
        rows.append(("Throughput", f"{t['target_tokens_per_second_median']:,.0f} target tokens per second "
                                   "(median over logging intervals)"))
    if t.get("final_train_loss") is not None:
        rows.append(("Final training loss", f"{t['final_train_loss']:.3f} (label-smoothed, per target token)"))
    hardware = t.get("hardware") or {}
    if hardware:
        parts = []
        if hardware.get("cpu"):
            parts.append(f"{hardware['cpu']}" + (f", {hardware['cpu_count']} cores" if hardware.get("cpu_count")
                                                 else ""))
        if hardware.get("torch_threads"):
            parts.append(_plural(hardware["torch_threads"], "torch thread"))
        if "cuda" in hardware:
            parts.append("CUDA" if hardware["cuda"] else "no GPU")
        if hardware.get("torch"):
            parts.append(f"torch {hardware['torch']}")
        rows.append(("Hardware", "; ".join(parts)))
    if t.get("world_size"):
        rows.append(("Processes", str(t["world_size"])))
    if command:
        rows.append(("Command", f"`{command}`"))
    return _table(("", ""), rows) if rows else ""


def _decoding_text(generation) -> str:
    beams, penalty = generation.get("num_beams"), generation.get("length_penalty")
    if beams is None and penalty is None:
        return ""
    settings = []
    if beams is not None:
        settings.append(f"beam search with {beams} beams" if beams > 1 else "greedy search")
    if penalty is not None:
        settings.append(f"length penalty {penalty}")
    return ("Decoding defaults (generation_config.json): " + ", ".join(settings) + ". When neither `max_length` "
            "nor `max_new_tokens` is set, a translation is at most the source length + 50 tokens long, as in §6.1. "
            "Hugging Face's length penalty divides a beam's score by `length ** penalty`, which is not the GNMT "
            "formula the paper used. Any `generate()` argument overrides these defaults, e.g. `num_beams=1`.")


def _limitations(known, dataset_label, model_config, test) -> str:
    items = []
    if known:
        items.append(known["domain"])
    elif dataset_label:
        items.append(f"The model knows only the domain of {dataset_label}; expect worse output elsewhere.")
    items.append("It translates single sentences; split documents into sentences first.")
    if model_config.get("max_position_embeddings"):
        items.append(f"Inputs of more than {model_config['max_position_embeddings']} tokens do not fit: the pipeline "
                     "truncates them (with a warning), and `generate` raises an error.")
    items.append("The model has not been evaluated for bias, robustness or safety. Do not use it where a wrong "
                 "translation can cause harm.")
    if not test:
        items.append("The run recorded no test-set score for these weights.")
    return "\n".join(f"- {item}" for item in items)


# --- helpers --------------------------------------------------------------------------------------------------------





def _languages(language, data_cfg) -> list[str]:
    if language:
        return [language] if isinstance(language, str) else [str(code) for code in language]
    pair = [data_cfg.get("source_lang"), data_cfg.get("target_lang")]
    return [str(code) for code in pair] if all(pair) else []


def _language_name(code) -> str:
    return LANGUAGE_NAMES.get(code, code)


def _dataset_id(path) -> str | None:
    """A Hub dataset id (``owner/name`` or ``name``) as given, else the folder or file name of a local path."""
    if not path:
        return None
    path = str(path)
    local = (path.startswith((".", "/", "~")) or path.count("/") > 1 or "\\" in path
             or Path(path).suffix.lower() in (".jsonl", ".json", ".csv", ".tsv", ".parquet", ".txt"))
    if not local and re.fullmatch(r"[\w.-]+(/[\w.-]+)?", path):
        return path
    name = Path(path.rstrip("/\\")).name
    return Path(name).stem if Path(name).suffix else name


def _is_multi30k(dataset_id, path) -> bool:
    return any("multi30k" in str(value).lower() for value in (dataset_id, path) if value)








def _table(header: tuple, rows: list[tuple]) -> str:
    if not rows:
        return ""
    lines = ["| " + " | ".join(header) + " |", "|" + "|".join(" --- " for _ in header) + "|"]
    lines += ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]
    return "\n".join(lines)


def _plural(n, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def _py(text: str) -> str:
    """A double-quoted Python string literal (JSON's escapes are valid Python)."""
    return json.dumps(text, ensure_ascii=False)


def _maybe(value, fmt: str = "{}") -> str:
    return "" if value is None else fmt.format(value)


def _count(n: int) -> str:
    if n >= 1e9:
        return f"{n / 1e9:.1f}B"
    if n >= 1e6:
        return f"{n / 1e6:.1f}M"
    if n >= 1e3:
        return f"{n / 1e3:.1f}k"
    return str(n)


def _duration(seconds: float) -> str:
    seconds = float(seconds)
    if seconds < 10:
        return f"{seconds:.1f} s"
    if seconds < 60:
        return f"{seconds:.0f} s"
    minutes = seconds / 60
    if minutes < 60:
        return f"{minutes:.0f} min"
    return f"{int(minutes // 60)} h {int(round(minutes % 60))} min"


# --- code snippets in the card --------------------------------------------------------------------------------------

def _examples(lang) -> list[str]:
    return EXAMPLES.get(lang, EXAMPLES["en"])


def _snippet_generate(repo: str, source) -> str:
    text = _examples(source)[1]
    return f'''from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

tokenizer = AutoTokenizer.from_pretrained({_py(repo)}, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained({_py(repo)}, trust_remote_code=True)

inputs = tokenizer([{_py(text)}], return_tensors="pt", padding=True)
outputs = model.generate(**inputs)  # the paper's beam search; see "Decoding defaults" below
print(tokenizer.batch_decode(outputs, skip_special_tokens=True)[0])'''


def _snippet_pipeline(repo: str, source) -> str:
    text = _examples(source)[1]
    return f'''from transformers import pipeline

translator = pipeline("translation", model={_py(repo)}, trust_remote_code=True)
print(translator({_py(text)})[0]["translation_text"])'''


def _snippet_finetune(repo: str, source, target) -> str:
    if source in EXAMPLES and target in EXAMPLES:
        pairs = list(zip(EXAMPLES[source], EXAMPLES[target]))
    else:
        pairs = [(f"source sentence {i}", f"its translation {i}") for i in range(1, 5)]
    pair_lines = "\n".join(f"    ({_py(s)}, {_py(t)})," for s, t in pairs)
    return f'''from datasets import Dataset
from huggingface_hub import hf_hub_download
from transformers import (AutoModelForSeq2SeqLM, AutoTokenizer, DataCollatorForSeq2Seq, Seq2SeqTrainer,
                          Seq2SeqTrainingArguments)

tokenizer = AutoTokenizer.from_pretrained({_py(repo)}, trust_remote_code=True)
model = AutoModelForSeq2SeqLM.from_pretrained({_py(repo)}, trust_remote_code=True)

pairs = [  # your (source, target) sentence pairs
{pair_lines}
]
train_dataset = Dataset.from_dict({{"source": [s for s, _ in pairs], "target": [t for _, t in pairs]}}).map(
    lambda batch: tokenizer(batch["source"], text_target=batch["target"], truncation=True,
                            max_length=model.config.max_position_embeddings),
    batched=True, remove_columns=["source", "target"])

args = Seq2SeqTrainingArguments(output_dir="finetuned", learning_rate=1e-4, per_device_train_batch_size=8,
                                num_train_epochs=10, save_strategy="no", report_to="none")
trainer = Seq2SeqTrainer(model=model, args=args, train_dataset=train_dataset, processing_class=tokenizer,
                         data_collator=DataCollatorForSeq2Seq(tokenizer, model=model))
trainer.train()
trainer.save_model("finetuned")  # weights, config, tokenizer and model code
hf_hub_download({_py(repo)}, "pipeline_vaswani.py", local_dir="finetuned")  # for pipeline("translation", ...)
# reload: AutoModelForSeq2SeqLM.from_pretrained("finetuned", trust_remote_code=True)'''


__all__ = ["render_model_card", "render_card", "trainer_model_card", "load_template",
           "fill_template"]
