"""What `vaswani-mt demo` does, without its web page: load a model (a folder or a Hub id), check the text typed into
the page, translate its lines in one batch with the beam's n-best list and each hypothesis' scores, and give the
attention maps of a chosen hypothesis. The page itself (Gradio) is `demo_app.py`; this module does not import gradio,
so it is tested, and usable, without it.

Scores of a hypothesis Y of |Y| tokens (end-of-sentence included, the decoder's start token not):

* ``log_prob``: log P(Y|X), the sum of the log-probabilities beam search gave its tokens (transformers'
  ``compute_transition_scores`` of the same ``generate()`` call);
* ``score``: what beam search ranks finished hypotheses by, ``log_prob / lp(Y)``, with the model's length penalty
  (transformers: lp = |Y| ** alpha; GNMT: ((5 + |Y|) / 6) ** alpha) — for a beam search exactly generate()'s
  ``sequences_scores``; for greedy decoding (beam size 1), which ranks nothing, the same formula.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer  # vaswani_mt/__init__.py registered the model

from ..files import first_line
from ..model.fast_decoding import gnmt_length_penalty
from ..model.modeling_vaswani import OUTPUT_LENGTH_MARGIN
from ..model.pipeline_vaswani import preprocess_source
from .heatmaps import attention_maps
from .translate import TranslateError, decoding_defaults, load_model_and_tokenizer, usable_device

MAX_LINES = 32  # sentences translated at once; more belong in a file for `vaswani-mt translate`
MAX_BEAMS = 16
EMPTY_TEXT = "Type a sentence to translate (one per line): the text is empty."
PREPROCESSING = {"lowercase_moses": "lowercased and Moses-tokenized"}


class DemoError(ValueError):
    """A problem with what the user gave (text, settings, model): one sentence meant for the page or the command
    line, never a traceback."""


@dataclass
class Hypothesis:
    """One hypothesis of the beam (rank 1 is the translation)."""

    rank: int
    text: str
    token_ids: list[int]  # the generated tokens, without the decoder start; ending with </s> when it ended
    tokens: list[str]
    log_prob: float  # log P(Y|X): the sum of its tokens' log-probabilities
    score: float  # log_prob / length penalty: what beam search ranks by (generate's sequences_scores)

    @property
    def length(self) -> int:
        return len(self.token_ids)


@dataclass
class SentenceResult:
    """One line of the input and its n-best list."""

    line: int  # 1-based line number in the text typed
    source: str  # the line as typed
    model_input: str  # what the tokenizer got: the line after the model's preprocessing (the same without one)
    source_ids: list[int]
    source_tokens: list[str]
    hypotheses: list[Hypothesis] = field(default_factory=list)

    @property
    def translation(self) -> str:
        return self.hypotheses[0].text if self.hypotheses else ""


# --- the model --------------------------------------------------------------------------------------------------------

HUB_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


def load_demo_model(name: str, device: str | None = None):
    """The model (eval mode, on `device`: default cuda, else mps, when available, else cpu) and tokenizer of `name`: a
    saved model folder, or a Hub id (``user/model``) that is not a folder here. Every problem is one `DemoError`: a
    missing folder, a Hub id that cannot be loaded (offline, unknown), a device that cannot be used, a folder
    without weights or tokenizer."""
    try:
        if Path(name).exists() or not HUB_ID.fullmatch(name):
            return load_model_and_tokenizer(name, device)
        device = usable_device(device)
    except TranslateError as error:
        raise DemoError(str(error)) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(name)
        model = AutoModelForSeq2SeqLM.from_pretrained(name)
    except (OSError, ValueError, RuntimeError) as error:
        raise DemoError(f"model folder {name} does not exist, and it cannot be loaded from the Hub either: "
                        f"{first_line(error)}") from None
    return model.to(device).eval(), tokenizer


def describe_decoding(model) -> str:
    """The model's decoding defaults in words."""
    defaults = decoding_defaults(model)
    alpha = defaults["length_penalty"]
    formula = (f"score = log P / ((5 + length) / 6) ** {alpha:g}, GNMT's" if defaults["length_penalty_style"] == "gnmt"
               else f"score = log P / length ** {alpha:g}")
    limit = (f"{defaults['max_new_tokens']} tokens" if defaults["max_new_tokens"] is not None
             else f"source length + {OUTPUT_LENGTH_MARGIN} tokens")
    return f"beam {defaults['num_beams']}, length penalty {alpha:g} ({formula}), at most {limit}"


def describe_preprocessing(model) -> str | None:
    """How the model wants its input prepared ("lowercased and Moses-tokenized"), or None for raw text."""
    preprocess = getattr(model.config, "preprocess", None)
    return None if preprocess is None else PREPROCESSING.get(preprocess, preprocess)


# --- the input --------------------------------------------------------------------------------------------------------

def source_lines(model, tokenizer, text: str | None) -> list[SentenceResult]:
    """The non-blank lines of `text`, preprocessed and tokenized as the model reads them (without hypotheses yet).
    `DemoError` for an empty text, more than `MAX_LINES` sentences, or a sentence longer than the model holds."""
    lines = [(number, line) for number, line in enumerate((text or "").splitlines(), start=1) if line.strip()]
    if not lines:
        raise DemoError(EMPTY_TEXT)
    if len(lines) > MAX_LINES:
        raise DemoError(f"{len(lines)} sentences are more than the demo translates at once ({MAX_LINES}): "
                        "translate a file with `vaswani-mt translate` instead.")
    limit = model.config.max_position_embeddings
    sentences = []
    for number, line in lines:
        model_input = preprocess_source(line, model.config)
        ids = tokenizer(model_input)["input_ids"]
        if len(ids) > limit:
            raise DemoError(f"Line {number} is {len(ids)} tokens long, more than this model holds "
                            f"(max_position_embeddings = {limit} tokens): shorten it or split it into sentences.")
        sentences.append(SentenceResult(number, line, model_input, ids, tokenizer.convert_ids_to_tokens(ids)))
    return sentences


def checked_settings(model, num_beams=None, length_penalty=None, max_new_tokens=None) -> dict:
    """generate() keywords for the settings given (None: the model's default), or `DemoError` naming a bad one.
    Numbers may come as floats from a slider (4.0)."""
    settings: dict = {}
    if num_beams is not None:
        if float(num_beams) != int(num_beams) or not 1 <= int(num_beams) <= MAX_BEAMS:
            raise DemoError(f"The beam size must be a whole number from 1 to {MAX_BEAMS}, not {num_beams}.")
        settings["num_beams"] = int(num_beams)
    if length_penalty is not None:
        if not math.isfinite(float(length_penalty)):
            raise DemoError(f"The length penalty must be a number, not {length_penalty}.")
        settings["length_penalty"] = float(length_penalty)
    if max_new_tokens is not None:
        limit = model.config.max_position_embeddings
        if float(max_new_tokens) != int(max_new_tokens) or not 1 <= int(max_new_tokens) <= limit:
            raise DemoError(f"The maximum length must be a whole number of tokens from 1 to {limit} (what this model "
                            f"holds), not {max_new_tokens}.")
        settings["max_new_tokens"] = int(max_new_tokens)
    return settings


# --- translating ------------------------------------------------------------------------------------------------------

def length_penalty_divisor(length: int, alpha: float, style: str) -> float:
    """The length penalty lp(Y) a hypothesis' log-probability is divided by (see the module docstring)."""
    return float(gnmt_length_penalty(length, alpha)) if style == "gnmt" else float(length) ** alpha


@torch.no_grad()
def translate_nbest(model, tokenizer, text: str | None, *, num_beams: int | None = None,
                    length_penalty: float | None = None, max_new_tokens: int | None = None) -> list[SentenceResult]:
    """Translate the non-blank lines of `text` in one batched ``generate()`` call and return, per line, every
    hypothesis of the beam (``num_return_sequences`` = beam size) with its log-probability and its length-normalised
    score, best first. Settings left at None are the model's (:func:`decoding_defaults`). `DemoError` for bad
    input (:func:`source_lines`, :func:`checked_settings`)."""
    sentences = source_lines(model, tokenizer, text)
    settings = checked_settings(model, num_beams, length_penalty, max_new_tokens)
    defaults = decoding_defaults(model)
    beams = settings.get("num_beams", defaults["num_beams"])
    alpha = settings.get("length_penalty", defaults["length_penalty"])
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else model.config.pad_token_id
    width = max(len(sentence.source_ids) for sentence in sentences)
    input_ids = torch.full((len(sentences), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(sentences), width), dtype=torch.long)
    for row, sentence in enumerate(sentences):
        input_ids[row, : len(sentence.source_ids)] = torch.tensor(sentence.source_ids, dtype=torch.long)
        attention_mask[row, : len(sentence.source_ids)] = 1
    was_training = model.training
    model.eval()
    try:
        output = model.generate(input_ids=input_ids.to(model.device), attention_mask=attention_mask.to(model.device),
                                num_return_sequences=beams, do_sample=False, output_scores=True,
                                return_dict_in_generate=True, **settings)
        beam_search = getattr(output, "beam_indices", None) is not None
        transition = model.compute_transition_scores(output.sequences, output.scores,
                                                     output.beam_indices if beam_search else None,
                                                     normalize_logits=not beam_search)
    finally:
        model.train(was_training)
    sequences = output.sequences.cpu()
    transition = transition.float().cpu()
    sequences_scores = output.sequences_scores.float().cpu() if beam_search else None
    eos = model.generation_config.eos_token_id
    eos = set(eos if isinstance(eos, list) else [eos])
    for row, sentence in enumerate(sentences):
        for rank in range(beams):
            index = row * beams + rank
            generated = sequences[index, 1:].tolist()  # the decoder start token is not part of the hypothesis
            end = next((i + 1 for i, token in enumerate(generated) if token in eos), len(generated))
            ids = generated[:end]
            log_prob = float(transition[index, : len(ids)].sum())
            score = (float(sequences_scores[index]) if sequences_scores is not None
                     else log_prob / length_penalty_divisor(len(ids), alpha, defaults["length_penalty_style"]))
            sentence.hypotheses.append(Hypothesis(rank + 1, tokenizer.decode(ids, skip_special_tokens=True), ids,
                                                  tokenizer.convert_ids_to_tokens(ids), log_prob, score))
    return sentences


def hypothesis_attention(model, tokenizer, sentence: SentenceResult, rank: int = 1) -> dict:
    """The attention maps (`vaswani_mt.inference.heatmaps.attention_maps`) of hypothesis `rank` (from 1) of a
    translated `sentence`: its exact tokens, as beam search produced them, fed to the decoder once."""
    if not 1 <= rank <= len(sentence.hypotheses):
        raise DemoError(f"Line {sentence.line} has {len(sentence.hypotheses)} hypotheses, not a number {rank}.")
    return attention_maps(model, tokenizer, sentence.source, target_ids=sentence.hypotheses[rank - 1].token_ids)


__all__ = ["DemoError", "Hypothesis", "SentenceResult", "MAX_LINES", "MAX_BEAMS", "checked_settings",
           "decoding_defaults", "describe_decoding", "describe_preprocessing", "hypothesis_attention",
           "length_penalty_divisor", "load_demo_model", "source_lines", "translate_nbest"]
