"""Joint source/target BPE tokenizer (Vaswani et al. 2017, §5.1).

The paper encodes sentences "using byte-pair encoding, which has a shared source-target vocabulary of
about 37000 tokens" (WMT 2014 English-German). :func:`train_tokenizer` learns such a *joint* BPE model
from both sides of the training data with the ``tokenizers`` library and wraps it as a Hugging Face
fast tokenizer (``PreTrainedTokenizerFast``, called ``TokenizersBackend`` in transformers 5).

Conventions other modules rely on:

* special tokens and ids: ``<pad>`` = 0, ``<unk>`` = 1, ``<s>`` = 2, ``</s>`` = 3;
* every encoding (source, and target via ``text_target=``) ends with ``</s>``; nothing is prepended
  (the model starts decoding from ``<s>`` as ``decoder_start_token_id``).

Text normalisation (the one documented contract for whitespace)
    :func:`normalize_text` is applied inside the tokenizer (as its ``normalizer``) and can be called on
    its own, e.g. on sacreBLEU references or by the data cleaning. It does, in order:

    1. Unicode NFKC. This maps the no-break space U+00A0 and the other typographic spaces to an
       ordinary space, and compatibility characters to their plain form (``ﬁ`` → ``fi``, ``²`` → ``2``,
       full-width letters → ASCII).
    2. Every run of whitespace (Unicode ``White_Space`` plus the ASCII separators U+001C-U+001F, i.e.
       whatever Python's ``str.split()`` splits on) becomes one space: TABs, newlines and double spaces
       disappear.
    3. Leading and trailing spaces are stripped.

    It does *not* unescape HTML entities (``&amp;``): that is a corpus-cleaning step done by
    :mod:`vaswani_mt.data.cleaning`, since at inference time ``&amp;`` may be what the user really typed.

Round trip
    For normalised text, ``tokenizer.decode(tokenizer(x).input_ids, skip_special_tokens=True) == x``:
    words are split with SentencePiece's ``Metaspace`` scheme (a space becomes part of the next piece
    as ``▁``) and, by default, punctuation from letters (``split_punctuation``: ``bushes.`` is ``▁bushes``
    + ``.``, no piece spans both), so spaces before punctuation, casing and umlauts come back exactly, and
    ``clean_up_tokenization_spaces`` is switched off so transformers does not "fix" spacing.
    The one exception is the character ``▁`` (U+2581) itself, which is the word-boundary marker and
    decodes as a space.

Unknown characters
    With ``byte_fallback=True`` (the default) the vocabulary holds the 256 byte tokens ``<0x00>`` …
    ``<0xFF>`` (ids 4-259), and a character never seen in training (an emoji, ``ø`` in an English-German
    model, …) is encoded as the bytes of its UTF-8 form and decoded back to the same character: nothing
    is lost and nothing crashes. With ``byte_fallback=False`` such a character becomes ``<unk>`` (id 1),
    which ``decode(..., skip_special_tokens=True)`` drops. All characters seen in the training text are
    in the base alphabet either way.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

logger = logging.getLogger(__name__)

PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN = "<pad>", "<unk>", "<s>", "</s>"
# The order fixes the ids: <pad>=0, <unk>=1, <s>=2, </s>=3 (the model config uses the same numbers).
SPECIAL_TOKENS = (PAD_TOKEN, UNK_TOKEN, BOS_TOKEN, EOS_TOKEN)
PAD_ID, UNK_ID, BOS_ID, EOS_ID = 0, 1, 2, 3

NUM_BYTE_TOKENS = 256
DEFAULT_MODEL_MAX_LENGTH = 1024
_WORD_BOUNDARY = "\u2581"  # "▁", SentencePiece's marker for a preceding space
_TEXT_BATCH_SIZE = 1000


def _build_normalizer() -> normalizers.Normalizer:
    # \s in the tokenizers (Oniguruma) regex is Unicode White_Space; U+001C-U+001F are added so the
    # result agrees with Python's str.split(), which the data cleaning uses to count words.
    return normalizers.Sequence(
        [
            normalizers.NFKC(),
            normalizers.Replace(Regex(r"[\s\x{1c}-\x{1f}]+"), " "),
            normalizers.Strip(left=True, right=True),
        ]
    )


# One normaliser object serves both normalize_text and every trained tokenizer, so the two cannot drift.
_NORMALIZER = _build_normalizer()


def normalize_text(text: str) -> str:
    """Apply the tokenizer's text normalisation: NFKC, whitespace runs → one space, strip.

    This is exactly what the tokenizer does to its input before splitting it (see the module
    docstring), so ``normalize_text(x)`` is what ``decode(encode(x))`` gives back. Apply it to
    references before computing BLEU against decoded hypotheses if the references contain odd
    whitespace (no-break spaces, double spaces).
    """
    return _NORMALIZER.normalize_str(text)


def byte_token(value: int) -> str:
    """The vocabulary entry for the raw byte ``value`` used by byte fallback, e.g. ``<0xC3>``."""
    return f"<0x{value:02X}>"


def _is_path(item: Any) -> bool:
    return isinstance(item, os.PathLike) or (isinstance(item, str) and os.path.isfile(item))


def _is_dataset(obj: Any) -> bool:
    # Imported lazily: `datasets` is heavy and not needed to tokenize at inference time.
    from datasets import Dataset, DatasetDict

    return isinstance(obj, (Dataset, DatasetDict))


def _dataset_texts(dataset: Any, languages: Sequence[str] | None, split: str) -> Iterator[str]:
    """Yield the sentences of every requested language from a ``Dataset``/``DatasetDict``."""
    from datasets import DatasetDict

    if isinstance(dataset, DatasetDict):
        if split not in dataset:
            raise ValueError(
                f"train_tokenizer: the DatasetDict has no split {split!r} (splits: {sorted(dataset)}); "
                "pass split=... to choose the one to learn the vocabulary from"
            )
        dataset = dataset[split]
    columns = dataset.column_names
    if "translation" in columns:
        first = dataset[0]["translation"] if len(dataset) else {}
        found = sorted(first)
        langs = list(languages) if languages is not None else found
        missing = [lang for lang in langs if lang not in first]
        if missing:
            raise ValueError(
                f"train_tokenizer: language(s) {missing} not in the 'translation' column; found {found}"
            )
        for batch in dataset.select_columns(["translation"]).iter(batch_size=_TEXT_BATCH_SIZE):
            for pair in batch["translation"]:
                for lang in langs:
                    yield pair[lang]
        return
    if languages is None:
        raise ValueError(
            "train_tokenizer: the dataset has no 'translation' column; pass languages=[...] naming the "
            f"text columns to use (columns: {columns})"
        )
    missing = [lang for lang in languages if lang not in columns]
    if missing:
        raise ValueError(f"train_tokenizer: column(s) {missing} not in the dataset; found {columns}")
    for batch in dataset.select_columns(list(languages)).iter(batch_size=_TEXT_BATCH_SIZE):
        for lang in languages:
            yield from batch[lang]


def _file_texts(paths: Sequence[str | os.PathLike]) -> Iterator[str]:
    for path in paths:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                yield line.rstrip("\n")


def _corpus_texts(corpus: Any, languages: Sequence[str] | None, split: str) -> Iterable[str]:
    """Turn any accepted corpus form into an iterable of sentences."""
    if _is_dataset(corpus):
        return _dataset_texts(corpus, languages, split)
    if languages is not None:
        raise ValueError("train_tokenizer: languages=... only applies to a datasets.Dataset/DatasetDict corpus")
    if isinstance(corpus, (str, os.PathLike)):
        if not _is_path(corpus):
            raise ValueError(
                f"train_tokenizer: {str(corpus)!r} is not an existing file; pass a list of sentences, "
                "a list of files or a dataset"
            )
        return _file_texts([corpus])
    if isinstance(corpus, (list, tuple)) and corpus and all(_is_path(item) for item in corpus):
        return _file_texts(corpus)
    if isinstance(corpus, (list, tuple)) and any(isinstance(item, os.PathLike) for item in corpus):
        missing = [str(item) for item in corpus if not _is_path(item)]
        raise FileNotFoundError(f"train_tokenizer: file(s) not found: {missing}")
    return corpus


def _add_byte_tokens(trained: Tokenizer) -> models.BPE:
    """Rebuild the trained BPE model with the 256 ``<0xNN>`` tokens right after the special tokens.

    ``BpeTrainer`` does not create byte tokens, and ``byte_fallback`` only works if they are in the
    vocabulary, so the learned pieces are renumbered to follow them (ids stay contiguous).
    """
    learned = json.loads(trained.to_str())["model"]
    vocab: dict[str, int] = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    for value in range(NUM_BYTE_TOKENS):
        vocab[byte_token(value)] = len(vocab)
    for token, _ in sorted(learned["vocab"].items(), key=lambda item: item[1]):
        if token not in vocab:
            vocab[token] = len(vocab)
    merges = [tuple(merge) for merge in learned["merges"]]
    return models.BPE(vocab=vocab, merges=merges, unk_token=UNK_TOKEN, byte_fallback=True)


def _build_pre_tokenizer(split_punctuation: bool) -> pre_tokenizers.PreTokenizer:
    """Words at spaces (``Metaspace``); with `split_punctuation`, each run of punctuation a piece of its own too."""
    words = pre_tokenizers.Metaspace(replacement=_WORD_BOUNDARY, prepend_scheme="always", split=True)
    if not split_punctuation:
        return words
    return pre_tokenizers.Sequence([words, pre_tokenizers.Punctuation(behavior="contiguous")])


def _build_backend(model: models.BPE, byte_fallback: bool, split_punctuation: bool) -> Tokenizer:
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = _build_normalizer()
    tokenizer.pre_tokenizer = _build_pre_tokenizer(split_punctuation)
    metaspace = decoders.Metaspace(replacement=_WORD_BOUNDARY, prepend_scheme="always", split=True)
    # ByteFallback must run before Metaspace: it turns runs of <0xNN> tokens back into characters.
    tokenizer.decoder = decoders.Sequence([decoders.ByteFallback(), metaspace]) if byte_fallback else metaspace
    tokenizer.post_processor = processors.TemplateProcessing(
        single=f"$A:0 {EOS_TOKEN}:0",
        pair=f"$A:0 {EOS_TOKEN}:0 $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, EOS_ID)],
    )
    return tokenizer


def _check_special_ids(tokenizer: Tokenizer) -> None:
    for expected_id, token in enumerate(SPECIAL_TOKENS):
        actual = tokenizer.token_to_id(token)
        if actual != expected_id:
            raise RuntimeError(f"special token {token} got id {actual}, expected {expected_id}")


def wrap_tokenizer(backend: Tokenizer, model_max_length: int = DEFAULT_MODEL_MAX_LENGTH) -> PreTrainedTokenizerFast:
    """Wrap a ``tokenizers.Tokenizer`` built by this module as a transformers fast tokenizer.

    ``add_eos_token=True`` is passed explicitly so that transformers (which rebuilds the
    post-processor from these flags when they are saved in ``tokenizer_config.json``) produces the
    same ``$A </s>`` template after ``AutoTokenizer.from_pretrained``.
    """
    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        unk_token=UNK_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        add_bos_token=False,
        add_eos_token=True,
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
        padding_side="right",
        truncation_side="right",
        model_input_names=["input_ids", "attention_mask"],
    )


def train_tokenizer(
    corpus: Any,
    vocab_size: int = 8000,
    min_frequency: int = 2,
    model_max_length: int = DEFAULT_MODEL_MAX_LENGTH,
    languages: Sequence[str] | None = None,
    byte_fallback: bool = True,
    split: str = "train",
    show_progress: bool = False,
    length: int | None = None,
    split_punctuation: bool = True,
) -> PreTrainedTokenizerFast:
    """Learn a joint BPE vocabulary over source and target text and return a fast tokenizer.

    Args:
        corpus: what to learn from, one of
            * a ``datasets.Dataset`` / ``DatasetDict`` with a ``translation`` column of ``{lang: text}``
              dicts (all languages are used unless ``languages`` narrows them; for a ``DatasetDict``
              only ``split`` is read, so the vocabulary never sees validation/test text), or with
              per-language text columns named by ``languages``;
            * a file path or a list of file paths (one sentence per line, UTF-8), e.g.
              ``["train.en", "train.de"]``; every item must be an existing file;
            * any other iterable of sentences (a list of strings, a generator).
        vocab_size: total vocabulary size, including the 4 special tokens and, with byte fallback,
            the 256 byte tokens.
        min_frequency: a pair must occur at least this often to be merged.
        model_max_length: the tokenizer's ``model_max_length`` (default truncation length).
        languages: which languages/columns of a dataset corpus to use.
        byte_fallback: encode unseen characters as UTF-8 byte tokens instead of ``<unk>``.
        split: the split of a ``DatasetDict`` to learn from.
        show_progress: show the ``tokenizers`` training progress bars (on a terminal).
        length: how many sentences the corpus yields, if known: the progress bar then shows an ETA.
        split_punctuation: pieces never join punctuation to letters: ``"bushes."`` is ``▁bushes`` + ``.``, as
            SentencePiece splits where the Unicode script changes. Without it (words split at spaces only),
            ``▁bushes.``, ``▁bushes,`` and ``▁bushes`` are learned as three unrelated pieces.

    Returns:
        A ``PreTrainedTokenizerFast`` whose encodings end with ``</s>``; ``<pad>``/``<unk>``/``<s>``/
        ``</s>`` have ids 0/1/2/3. Training is deterministic for the same text and settings.

    The corpus is normalised with :func:`normalize_text` during training (it is the tokenizer's
    normaliser), but it is not otherwise cleaned: pass cleaned data, e.g. from
    :func:`vaswani_mt.data.cleaning.load_parallel`.
    """
    reserved = len(SPECIAL_TOKENS) + (NUM_BYTE_TOKENS if byte_fallback else 0)
    if vocab_size <= reserved:
        raise ValueError(f"vocab_size={vocab_size} leaves no room for learned pieces ({reserved} ids are reserved)")
    texts = _corpus_texts(corpus, languages, split)

    scratch = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    scratch.normalizer = _build_normalizer()
    scratch.pre_tokenizer = _build_pre_tokenizer(split_punctuation)
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - (NUM_BYTE_TOKENS if byte_fallback else 0),
        min_frequency=min_frequency,
        special_tokens=list(SPECIAL_TOKENS),
        show_progress=show_progress,
    )
    scratch.train_from_iterator(texts, trainer, length=length)
    if scratch.get_vocab_size() <= len(SPECIAL_TOKENS):
        raise ValueError("train_tokenizer: the corpus is empty; nothing to learn a vocabulary from")

    model = _add_byte_tokens(scratch) if byte_fallback else scratch.model
    backend = _build_backend(model, byte_fallback, split_punctuation)
    backend.add_special_tokens(list(SPECIAL_TOKENS))
    _check_special_ids(backend)
    logger.info(
        "trained joint BPE tokenizer: %d tokens (%d learned, byte_fallback=%s, split_punctuation=%s)",
        backend.get_vocab_size(), scratch.get_vocab_size() - len(SPECIAL_TOKENS), byte_fallback, split_punctuation,
    )
    return wrap_tokenizer(backend, model_max_length=model_max_length)

