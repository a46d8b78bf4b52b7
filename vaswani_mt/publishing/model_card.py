"""Model cards (README.md) for trained vaswani_mt models, rendered with huggingface_hub's Jinja model cards.

* :func:`render_model_card` ``(run_dir, repo_id=None)``: the card of a run folder written by ``vaswani-mt train``
  (its `RunRecord`), as ``vaswani-mt push`` uploads it.
* :func:`trainer_model_card` ``(record)``: the card ``VaswaniTrainer.push_to_hub`` writes, from
  `RunRecord.from_trainer`.

The metadata is a ``ModelCardData`` (``language``, ``license`` (+ ``license_name`` / ``license_link`` for ``other``),
``library_name``, ``pipeline_tag``, ``tags``, ``datasets``, ``metrics``, and one ``EvalResult`` per score, giving the
``model-index`` of the measured test scores, sacreBLEU signatures in their ``args``); the text is
``ModelCard.from_template`` with ``model_card_template.md`` (shipped inside the package), given the run's facts and
table rows made from them. Every number comes from the run: a metric the run did not record is left out.

What the card says about the data (its name, terms, domain, citation) comes from the run config's
``data.description`` (the shipped Multi30k configs describe Multi30k); without one the card uses generic wording.
Licence: the weights are derived from the training data, so the default licence is ``other``, named and linked as the
data description says. Pass ``license="apache-2.0"`` (or any Hub licence id) when the data allows it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import re
from pathlib import Path

from ..data.reading import is_hub_dataset_id
from ..recipe.progress import duration
from ..run_record import RunRecord
from .seeds import recipe_runs, spread

TEMPLATE_NAME = "model_card_template.md"
TEMPLATE_PATH = Path(__file__).with_name(TEMPLATE_NAME)
DEFAULT_TAGS = ["translation", "transformer", "vaswani_mt", "attention-is-all-you-need", "custom_code"]

LANGUAGE_NAMES = {
    "ar": "Arabic", "cs": "Czech", "de": "German", "en": "English", "es": "Spanish", "fi": "Finnish", "hi": "Hindi",
    "fr": "French", "it": "Italian", "ja": "Japanese", "nl": "Dutch", "pl": "Polish", "pt": "Portuguese",
    "ro": "Romanian", "ru": "Russian", "tr": "Turkish", "uk": "Ukrainian", "zh": "Chinese",
}
# Example sentences for the card's code (other languages fall back to English, or to placeholders for fine-tuning).
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
TEST_METRICS = [  # (field of the test scores, metric type, display name, signature field)
    ("bleu", "bleu", "BLEU (sacreBLEU: cased, 13a tokenization, detokenized output)", "bleu_signature"),
    ("chrf", "chrf", "chrF (sacreBLEU)", "chrf_signature"),
    ("bleu_lowercased_moses_tokenized", "bleu", "BLEU, lowercased and Moses-tokenized (sacreBLEU, tok:none)",
     "bleu_lowercased_moses_tokenized_signature"),
]
# The same scores of a model trained and scored on lowercased, Moses-tokenized text (`TestScores.preprocess`).
PREPROCESSED_NAMES = {"bleu": "BLEU (sacreBLEU, 13a tokenization, on lowercased Moses-tokenized output)",
                      "chrf": "chrF (sacreBLEU, on lowercased Moses-tokenized output)",
                      "bleu_lowercased_moses_tokenized": "BLEU, lowercased and Moses-tokenized (multi-bleu.perl's: "
                                                         "sacreBLEU tok:none on the output as it is)"}


def _test_metrics(test) -> list[tuple[str, str, str, str]]:
    """`TEST_METRICS` measured in `test`, named for the text they were computed on."""
    names = PREPROCESSED_NAMES if test.get("preprocess") else {}
    return [(key, kind, names.get(key, name), signature) for key, kind, name, signature in TEST_METRICS if key in test]


# --- entry points ---------------------------------------------------------------------------------------------------

def render_model_card(run_dir, repo_id: str | None = None, *, license: str | None = None,  # noqa: A002
                      license_name: str | None = None, license_link: str | None = None,
                      dataset: str | None = None, seed_runs=()) -> str:
    """The README.md of a run folder written by ``vaswani-mt train`` (its `RunRecord`).

    `repo_id` ("user/name") names the model and goes into the usage code; without it the code reads
    ``"<namespace>/<name>"``. `license` is a Hub licence id; by default ``other``, described by `license_name` /
    `license_link` or by the run's data description. `dataset` overrides the dataset id of the metadata (by default:
    the data description's ``hub_id``, else ``data.path`` of the run config when it is a Hub id, else its folder
    name). `seed_runs`: run folders of the same recipe with other seeds; the card then gives the recipe's mean and
    spread beside this run's scores (`SeedRunError` names a folder that is not such a run)."""
    record = RunRecord.read(run_dir)
    return render_card(record, repo_id=repo_id, license=license, license_name=license_name,
                       license_link=license_link, dataset=dataset,
                       seeds=seed_runs_of(run_dir, seed_runs) if seed_runs else None)


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
    return TEMPLATE_PATH.read_text(encoding="utf-8")


def card_from_template(card_data, template: str | None = None, **context):
    """``ModelCard.from_template`` with our template (or the Jinja text `template`) and `context`. A template that
    names a value it is not given raises `KeyError` (a template bug; jinja2 would print it as nothing)."""
    import jinja2
    import jinja2.meta
    from huggingface_hub import ModelCard

    environment = jinja2.Environment()
    given = {"card_data", *card_data.to_dict(), *context, *environment.globals}
    text = load_template() if template is None else template
    unknown = sorted(jinja2.meta.find_undeclared_variables(environment.parse(text)) - given)
    if unknown:
        raise KeyError(f"model card template: unknown key {unknown[0]!r}")
    if template is None:
        return ModelCard.from_template(card_data, template_path=str(TEMPLATE_PATH), **context)
    return ModelCard.from_template(card_data, template_str=template, **context)


def render_card(record: RunRecord, repo_id: str | None = None, license: str | None = None,  # noqa: A002
                license_name: str | None = None, license_link: str | None = None, dataset: str | None = None,
                language=None, extra_tags=None, model_name: str | None = None, seeds=None) -> str:
    """The card text of a run's record; `seeds`: `seed_runs_of` the record, for the recipe's mean and spread."""
    from huggingface_hub import ModelCardData

    config = record.config
    data = config.get("data") or {}
    about = {key: value for key, value in (data.get("description") or {}).items() if value}
    model_config = record.model_config or record.model.config
    preset = (config.get("model") or {}).get("preset") or record.model.preset
    parameters = record.model.parameters

    languages = [language] if isinstance(language, str) else [str(code) for code in language or []]
    if not languages and data.get("source_lang") and data.get("target_lang"):
        languages = [str(data["source_lang"]), str(data["target_lang"])]
    source, target = languages if len(languages) == 2 else (None, None)
    dataset_id = dataset or about.get("hub_id") or _dataset_id(data.get("path"))
    data_name = about.get("name") or dataset_id
    name = model_name or (repo_id.split("/")[-1] if repo_id else record.name or "vaswani-mt-model")
    test = _measured_test(record.test)
    results = _eval_results(test, dataset_id, data_name, source, target, record.data_revision)

    if license and license != "other":
        licence = {"license": license}
    else:
        licence = {"license": "other", "license_name": license_name or about.get("license_name")
                   or "training-data-terms", "license_link": license_link or about.get("license_link")}
    card_data = ModelCardData(
        language=languages or None, **licence, library_name="transformers", pipeline_tag="translation",
        tags=DEFAULT_TAGS + ([extra_tags] if isinstance(extra_tags, str) else list(extra_tags or [])),
        datasets=[dataset_id] if dataset_id else None, metrics=sorted({r.metric_type for r in results}) or None,
        eval_results=results or None, model_name=name if results else None)
    for key in ("language", "license", "license_name", "license_link", "library_name", "pipeline_tag", "tags",
                "datasets", "metrics"):
        card_data[key] = card_data.pop(key)  # the metadata's order: language first, as before (model-index last)

    path = data.get("path")
    pairs = (list(zip(EXAMPLES[source], EXAMPLES[target])) if source in EXAMPLES and target in EXAMPLES
             else [(f"source sentence {i}", f"its translation {i}") for i in range(1, 5)])
    card = card_from_template(
        card_data, title=name, repo=_py(repo_id or f"<namespace>/{name}"), about=about, data_name=data_name,
        source=source, target=target, source_name=LANGUAGE_NAMES.get(source, source),
        target_name=LANGUAGE_NAMES.get(target, target), preset=preset, preprocess=model_config.get("preprocess"),
        shape=_shape(model_config, parameters),
        example=_py(EXAMPLES.get(source, EXAMPLES["en"])[1]), pairs=[(_py(s), _py(t)) for s, t in pairs],
        decoding=_decoding(record.generation_config), results=_results(test, data_name),
        gnmt=record.generation_config.get("length_penalty_style") == "gnmt",
        selection=record.selection, validation=record.validation,
        architecture=_architecture_rows(model_config, preset, parameters),
        data=data, tokenizer=config.get("tokenizer") or {},
        vocab=model_config.get("vocab_size") or (config.get("tokenizer") or {}).get("vocab_size"),
        hub_path=path if path and _dataset_id(path) == path else None, data_revision=record.data_revision,
        splits=[f"{role} `{data[key]}`" for key, role in (("train_split", "training"), ("valid_split", "validation"),
                                                           ("test_split", "test")) if data.get(key)],
        cleaning=_cleaning_rows(record.data),
        recipe=_recipe_rows(config.get("training") or {}, data.get("valid_subset"),
                            record.training.steps if record.training else None,
                            _precision(record.training),
                            record.training.gradient_accumulation_steps if record.training else None,
                            record.training.time_budget if record.training else None),
        run=_run_rows(record.training, record.command), seeds=seeds,
        max_positions=model_config.get("max_position_embeddings"),
        licence={"id": licence["license"], "link": licence.get("license_link"), "name_given": bool(license_name)})
    return re.sub(r"\n{3,}", "\n\n", str(card)).strip() + "\n"


# --- facts -> values for the template -------------------------------------------------------------------------------

def _measured_test(test) -> dict:
    """The test scores with only the metrics that were measured (numbers, not None/NaN)."""
    out = {k: v for k, v in (dataclasses.asdict(test) if test else {}).items() if v is not None}
    for key, *_ in TEST_METRICS:
        value = out.get(key)
        if not isinstance(value, (int, float)) or isinstance(value, bool) or math.isnan(value):
            out.pop(key, None)
    return out


def _eval_results(test, dataset_id, data_name, source, target, revision=None) -> list:
    """The model-index entries (one `EvalResult` per measured metric, its sacreBLEU signature in ``args``; the Hub
    dataset's commit the run read as ``dataset_revision``)."""
    from huggingface_hub import EvalResult

    if not dataset_id:
        return []
    args = {k: test[k] for k in ("num_beams", "sentences") if k in test}
    return [EvalResult(task_type="translation", task_name=f"Translation {source}-{target}" if source else "Translation",
                       dataset_type=dataset_id, dataset_name=data_name, dataset_split=test.get("split"),
                       dataset_config=f"{source}-{target}" if source else None, dataset_revision=revision,
                       metric_type=metric_type, metric_value=test[key], metric_name=metric_name,
                       metric_args={**({"signature": test[signature]} if signature in test else {}), **args} or None)
            for key, metric_type, metric_name, signature in _test_metrics(test)]


def _results(test, data_name) -> dict | None:
    """The test scores as the card's headline and Results section show them (None: no score was measured)."""
    rows = [(name, f"{test[key]:.2f}", test.get(signature)) for key, _, name, signature in _test_metrics(test)]
    if not rows:
        return None
    sentences = f"{test['sentences']:,}" if "sentences" in test else None
    details = [sentences and f"{sentences} sentences", "num_beams" in test and f"beam {test['num_beams']}"]
    return {"rows": rows, "where": " ".join(p for p in (data_name, test.get("split")) if p), "sentences": sentences,
            "scores": [f"{name} {test[key]:.2f}" for key, name in (("bleu", "BLEU"), ("chrf", "chrF")) if key in test],
            "details": [d for d in details if d], "num_beams": test.get("num_beams"), "seconds": test.get("seconds"),
            "preprocess": test.get("preprocess")}


def seed_runs_of(run_dir, folders) -> dict:
    """The run in `run_dir` and its sibling seeds (`publishing.seeds.recipe_runs`) as the card's Seeds section shows
    them: a row per run, and the mean (lowest–highest, sd) of its test score: cased BLEU, or the lowercased
    Moses-tokenized BLEU of a run on such text."""
    runs = recipe_runs(run_dir, folders)
    lctok = any(run.test_lctok is not None for run in runs)
    name, score = (("lowercased tokenized BLEU", lambda run: run.test_lctok) if lctok
                   else ("BLEU", lambda run: run.test))
    header = ["run", "seed", "machine", "updates", "minutes", f"test {name}"]
    rows = [[f"`{run.name}`", _or_dash(run.seed), run.machine, _or_dash(run.updates, "{:,}"),
             _or_dash(run.minutes, "{:.1f}"), _or_dash(score(run), "{:.2f}")] for run in runs]
    return {"count": len(runs), "header": header, "rows": rows,
            "means": [(name, str(spread(score(run) for run in runs)))]}


def _shape(m, parameters) -> list[str]:
    parts = []
    if m.get("encoder_layers") is not None and m.get("decoder_layers") is not None:
        parts.append(f"{m['encoder_layers']}+{m['decoder_layers']} layers")
    if m.get("d_model") is not None:
        parts.append(f"d_model {m['d_model']}")
    if m.get("encoder_attention_heads") is not None:
        parts.append(f"{m['encoder_attention_heads']} heads")
    if parameters:
        parts.append(f"{_count(parameters)} parameters")
    return parts


def _decoding(generation) -> list[str]:
    beams, penalty = generation.get("num_beams"), generation.get("length_penalty")
    gnmt = " (GNMT's formula, §6.1)" if generation.get("length_penalty_style") == "gnmt" else ""
    return ([] if beams is None else [f"beam search with {beams} beams" if beams > 1 else "greedy search"]) + \
        ([] if penalty is None else [f"length penalty {penalty}{gnmt}"])


def _architecture_rows(m, preset, parameters) -> list[tuple]:
    rows = [("Architecture", "encoder-decoder Transformer (§3)")]
    if preset:
        rows.append(("Preset", f"`{preset}`"))
    if "encoder_layers" in m:
        rows.append(("Layers (N)", f"{m['encoder_layers']} encoder, {m.get('decoder_layers', '?')} decoder"))
    if "d_model" in m:
        rows.append(("d_model", str(m["d_model"])))
    for key, label in (("attention_heads", "Attention heads (h)"), ("ffn_dim", "Feed-forward (d_ff)")):
        if f"encoder_{key}" in m:
            enc, dec = m[f"encoder_{key}"], m.get(f"decoder_{key}", m[f"encoder_{key}"])
            rows.append((label, str(enc) if dec == enc else f"{enc} encoder, {dec} decoder"))
    if m.get("d_k") is not None or m.get("d_v") is not None:  # Table 3 (B); unset, both are d_model / h
        rows.append(("Head sizes (d_k, d_v)", ", ".join(str(m.get(key) or "d_model / h") for key in ("d_k", "d_v"))))
    for key, label in (("activation_function", "Activation"), ("dropout", "Dropout (P_drop)"),
                       ("attention_dropout", "Attention dropout"), ("activation_dropout", "Activation dropout")):
        if key in m:
            rows.append((label, str(m[key])))
    if "norm_style" in m:
        rows.append(("Layer norm", {"post": "post-norm, LayerNorm(x + Sublayer(x)) as in the paper (§3.1)",
                                    "pre": "pre-norm, x + Sublayer(LayerNorm(x))"}.get(m["norm_style"],
                                                                                       m["norm_style"])))
    if "max_position_embeddings" in m:
        kind = ("learned, one table per stack (Table 3 (E))" if m.get("position_embedding") == "learned"
                else "sinusoidal (§3.5)")
        rows.append(("Positions", f"{kind}, at most {m['max_position_embeddings']} tokens"))
    embedding = [text for key, text in (("share_embeddings", "shared by source and target"),
                                        ("tie_word_embeddings", "tied to the output projection"),
                                        ("scale_embedding", "scaled by sqrt(d_model)")) if m.get(key)]
    if embedding:
        rows.append(("Embeddings", ", ".join(embedding) + " (§3.4)"))
    if "vocab_size" in m:
        rows.append(("Vocabulary", f"{m['vocab_size']:,} tokens"))
    if parameters:
        rows.append(("Parameters", f"{parameters:,}"))
    return rows


def _cleaning_rows(cleaning) -> list[tuple]:
    rows = []
    for split, report in cleaning.items():
        if not isinstance(report, dict):
            continue
        dropped = report.get("dropped") or {}
        dropped_text = str(sum(dropped.values()))
        if dropped:
            dropped_text += " (" + ", ".join(f"{reason}: {count}" for reason, count in dropped.items()) + ")"
        rows.append((f"`{split}`", _maybe(report.get("pairs_in"), "{:,}"), _maybe(report.get("pairs_out"), "{:,}"),
                     dropped_text if report.get("filtered", True) else "not filtered",
                     _maybe(report.get("html_unescaped")), _maybe(report.get("text_normalized"))))
    return rows


def _cooldown(t, updates: int | None) -> str:
    """The cool-down's span, and where the run stopped if that was before the cool-down ended."""
    if not t.get("cooldown_steps") or not t.get("max_steps"):
        return ""
    end = t["max_steps"]
    text = f"; then a linear fall to 0 over updates {end - t['cooldown_steps'] + 1:,}-{end:,} (not in the paper)"
    return text + (f", but the run stopped at update {updates:,}" if updates is not None and updates < end else "")


def _planned_cooldown(plan, updates: int | None) -> str:
    """The cool-down a time budget laid out (and where the run stopped if that was before its end)."""
    start = plan.fall_start()
    if start is None:
        return ""
    text = f"; then a linear fall to 0 over updates {start + 1:,}-{plan.updates:,} (not in the paper)"
    return text + (f", but the run stopped at update {updates:,}" if updates is not None and updates < plan.updates
                   else "")


def _budget_length(plan) -> str:
    """What a time budget planned on the run's machine, and what the run took."""
    minutes = f"{plan.budget_minutes:g} minute" + ("" if plan.budget_minutes == 1 else "s")
    pace = (f" ({plan.seconds_per_update:.3g} s per update, {plan.seconds_per_validation:.0f} s per validation)"
            if plan.seconds_per_update else "")
    took = f"; the run took {plan.run_minutes:.1f} minutes" if plan.run_minutes is not None else ""
    resumed = ", resumed and re-planned from the time left" if plan.resumed else ""
    warmup = f", the warm-up over {plan.warmup_steps:,} of them" if plan.warmup_steps else ""
    test = (f", the test translation cut to its first {plan.test_sentences:,} sentences"
            if plan.test_sentences is not None else "")
    return (f"a time budget of {minutes}: {plan.updates:,} updates planned on its machine{pace}{resumed}, the "
            f"schedule laid over them{warmup}{test}{took}")


def _precision(training) -> str | None:
    """What the run computed in and why (the record's), and how many updates float16's loss scaling skipped."""
    if training is None or not training.precision:
        return None
    if training.skipped_updates is None:
        return training.precision
    return (f"{training.precision}; {training.skipped_updates:,} of {training.steps or 0:,} updates skipped (their "
            "gradients overflowed in float16)")


def _recipe_rows(t, subset: int | None = None, updates: int | None = None, precision: str | None = None,
                 accumulation: int | None = None, plan=None) -> list[tuple]:
    """The training section of a run config as table rows; `subset`: data.valid_subset (validation on that many);
    `updates`: the run's updates (the record's), to say whether it finished its cool-down; `precision`: what the run
    computed in and why (the record's; runs before it have only `bf16`, true or false); `plan`: how a time budget
    laid the run out (the record's `TimeBudgetPlan`)."""
    rows = []
    until = f" and {t['max_minutes']} minutes" if t.get("max_minutes") else ""
    if "adam_beta1" in t:
        rows.append(("Optimizer", f"Adam, β1 = {t['adam_beta1']}, β2 = {t.get('adam_beta2')}, "
                                  f"ε = {t.get('adam_epsilon')} (§5.3)"))
    if "warmup_steps" in t:
        factor = t.get("noam_factor")
        rows.append(("Learning rate", f"Noam schedule, d_model^-0.5 · min(step^-0.5, step · warmup^-1.5), "
                                      f"{t['warmup_steps']} warm-up steps"
                     + (f", factor {factor}" if factor not in (None, 1, 1.0) else "") + " (§5.3)"
                     + (_planned_cooldown(plan, updates) if plan and plan.updates else _cooldown(t, updates))))
    if "label_smoothing" in t:
        rows.append(("Label smoothing", f"ε_ls = {t['label_smoothing']} (§5.4)"))
    if t.get("bpe_dropout"):
        rows.append(("BPE-dropout", f"p = {t['bpe_dropout']}: training pieces split into the halves their merge "
                                    "joined, anew each epoch (Provilkov et al. 2020; not in the paper)"))
    if t.get("rdrop_alpha"):
        rows.append(("R-Drop", f"α = {t['rdrop_alpha']}: each batch through the model twice, the symmetric KL "
                               "divergence of the two passes' outputs added to the loss (Liang et al. 2021; not in the "
                               "paper)"))
    if t.get("max_tokens"):
        accumulation = accumulation or t.get("gradient_accumulation_steps") or 1  # the run's, else the config's
        rows.append(("Batch", f"about {t['max_tokens']:,} tokens per side, sentences of similar length batched "
                              "together (§5.1)" + (f", × {accumulation} gradient accumulation" if accumulation > 1
                                                   else "")))
    elif t.get("per_device_train_batch_size"):
        rows.append(("Batch", f"{t['per_device_train_batch_size']} sentences per device"))
    if plan and plan.updates:
        rows.append(("Length", _budget_length(plan)))
    elif t.get("max_steps"):
        rows.append(("Length", f"at most {t['max_steps']:,} updates" + until))
    elif t.get("num_epochs"):
        rows.append(("Length", f"at most {t['num_epochs']:,g} epochs" + until))  # 1000.0 -> 1,000
    if "weight_decay" in t:
        rows.append(("Weight decay", str(t["weight_decay"])))
    if "max_grad_norm" in t:
        rows.append(("Gradient clipping", f"max norm {t['max_grad_norm']}" if t["max_grad_norm"] else "none"))
    if t.get("eval_steps"):
        rows.append(("Validation", f"beam-search BLEU every {t['eval_steps']:,} updates"
                     + (f", beam {t['num_beams']}" if t.get("num_beams") else "")
                     + (f", on the first {subset:,} validation pairs" if subset else "")))
    if t.get("average_last") and t["average_last"] > 1:
        saves = (f"weight snapshots, taken every {t['average_every']:,} updates" if t.get("average_every")
                 else "checkpoints")
        rows.append(("Checkpoint averaging", f"the last {t['average_last']} {saves}, kept if better on "
                                             "validation (§6.1)"))
    if precision:
        rows.append(("Precision", precision))
    elif t.get("bf16") in (True, False):
        rows.append(("Precision", "bfloat16 autocast" if t["bf16"] else "float32"))
    if "seed" in t:
        rows.append(("Seed", str(t["seed"])))
    return rows


def _run_rows(t, command) -> list[tuple]:
    rows = []
    if t.steps is not None:
        rows.append(("Updates", f"{t.steps:,}"))
    if t.epochs is not None:
        rows.append(("Epochs", str(t.epochs)))
    if t.train_runtime_seconds is not None:
        rows.append(("Training time", duration(t.train_runtime_seconds) + " (evaluations included)"))
    if t.target_tokens_per_second_median is not None:
        rows.append(("Throughput", f"{t.target_tokens_per_second_median:,.0f} target tokens per second "
                                   "(median over logging intervals)"))
    if t.final_train_loss is not None:
        rows.append(("Final training loss", f"{t.final_train_loss:.3f} (label-smoothed, per target token)"))
    h = t.hardware
    if h:
        parts = [f"{h.cpu}" + (f", {h.cpu_count} cores" if h.cpu_count else "") if h.cpu else None,
                 h.torch_threads and f"{h.torch_threads} torch thread" + ("" if h.torch_threads == 1 else "s"),
                 None if h.cuda is None else (h.gpu or "CUDA") if h.cuda else "no GPU", h.torch and f"torch {h.torch}"]
        rows.append(("Hardware", "; ".join(p for p in parts if p)))
    if t.world_size:
        rows.append(("Processes", str(t.world_size)))
    if command:
        rows.append(("Command", f"`{command}`"))
    return rows


# --- helpers --------------------------------------------------------------------------------------------------------

def _dataset_id(path) -> str | None:
    """A Hub dataset id (``owner/name`` or ``name``) as given, else the folder or file name of a local path."""
    if not path:
        return None
    path = str(path)
    if is_hub_dataset_id(path):  # the data layer's one rule
        return path
    name = Path(path.rstrip("/\\")).name
    return Path(name).stem if Path(name).suffix else name


def _py(text: str) -> str:
    """A double-quoted Python string literal (JSON's escapes are valid Python)."""
    return json.dumps(text, ensure_ascii=False)


def _maybe(value, fmt: str = "{}") -> str:
    return "" if value is None else fmt.format(value)


def _or_dash(value, fmt: str = "{}") -> str:
    return "–" if value is None else fmt.format(value)


def _count(n: int) -> str:
    for size, suffix in ((1e9, "B"), (1e6, "M"), (1e3, "k")):
        if n >= size:
            return f"{n / size:.1f}{suffix}"
    return str(n)


__all__ = ["card_from_template", "load_template", "render_card", "render_model_card", "trainer_model_card"]
