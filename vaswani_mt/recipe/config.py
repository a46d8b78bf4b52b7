"""The YAML run configuration of `vaswani-mt train`: typed sections, validated before any work starts.

A config file has the sections `data`, `tokenizer`, `model`, `training`, the key `output_dir` and optionally a
`quick` section of dotted overrides applied by `--quick`. Command-line overrides are dotted too:
`--training.max_steps 300 --model.config.norm_style pre`. Every error names the key (and, for unknown keys,
suggests the closest known one).
"""

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..data.reading import is_hub_dataset_id
from ..data.tokenization import NUM_BYTE_TOKENS, SPECIAL_TOKENS
from ..data.tokenizing import max_length_problem
from ..data.workers import workers_problem
from ..model.configuration_vaswani import PREPROCESSING, PRESETS, VaswaniConfig
from ..precision import PRECISIONS
from ..typed import MappingError, from_mapping, suggestion
from .rules import cooldown_problem, positive_problem, setting_problem

SHIPPED_CONFIGS = Path(__file__).parent.parent / "configs"


MULTI30K_SOURCE = "https://github.com/multi30k/dataset"  # where the shipped configs' default data comes from


class ConfigError(ValueError):
    """An invalid run configuration; the message names the key and the rule."""


@dataclass
class DataDescription:
    """What the model card says about the training data; a field left out gets the card's generic wording."""

    name: str | None = None  # the data's name in the card's text, e.g. Multi30k (default: its dataset id)
    hub_id: str | None = None  # its Hub dataset id for the card's metadata (default: data.path or its folder name)
    license_name: str | None = None  # the card's licence name (license: other) for weights bound by the data's terms
    license_link: str | None = None  # where the data's terms are published
    terms: str | None = None  # the data's terms of use, which the weights inherit (the card's Licence section)
    domain: str | None = None  # what the text is and its biases: where the model works (the card's Limitations)
    citation: str | None = None  # BibTeX of the data, cited by the card


@dataclass
class DataConfig:
    path: str = "../shared/data/multi30k"  # folder of {split}.{lang} files, a JSONL/CSV/Parquet file, or a Hub id
    # a Hub dataset's branch, tag or commit (None: main); the run pins the commit it resolves to, for its card and
    # --resume (vaswani_mt.data.sources)
    revision: str | None = None
    source_lang: str = "en"
    target_lang: str = "de"
    train_split: str = "train"
    valid_split: str = "valid"
    test_split: str | None = "test2016"  # scored with beam search after training; None to skip
    valid_subset: int | None = None  # score BLEU during training on the first N valid pairs only (faster)
    max_length: int = 256  # tokens; longer training examples are truncated (a warning counts them)
    drop_duplicates: bool = False  # drop exact duplicate training pairs
    # "lowercase_moses": lowercase and Moses-tokenize both sides before the tokenizer (the literature's Multi30k
    # protocol); the model records it, so translate and the pipeline do the same to raw input, and its test BLEU is
    # then multi-bleu's, on the tokenized lowercase output. None: raw text.
    preprocess: str | None = None
    description: DataDescription = field(default_factory=DataDescription)  # licence, domain, citation for the card
    # processes that clean and tokenize a large split (100k pairs or more) in parallel; None: the cores this process
    # may use (its CPU affinity). The prepared data is the same for any count, so it does not enter the cache key.
    workers: int | None = None
    # where the prepared (cleaned, tokenized) data is kept for the next run, resume and process to reuse; None:
    # $VASWANI_MT_CACHE, else ~/.cache/vaswani_mt (vaswani_mt.data.cache; `vaswani-mt cache` lists and prunes it)
    cache_dir: str | None = None


@dataclass
class TokenizerConfig:
    path: str | None = None  # an existing tokenizer folder; None trains a joint BPE on the training split (§5.1)
    vocab_size: int = 8000
    min_frequency: int = 2
    sample: int | None = None  # learn the BPE on this many training pairs, evenly spread (None: all of them)
    # no piece joins punctuation to letters ("bushes." = "▁bushes" + "."), as SentencePiece splits where the script
    # changes; false: words split at spaces only, and "bushes.", "bushes," and "bushes" are three unrelated pieces
    split_punctuation: bool = True


@dataclass
class ModelConfig:
    preset: str = "small"  # base / big (Table 3), small, mini (Wu et al. 2021), tiny
    config: dict = field(default_factory=dict)  # VaswaniConfig fields overriding the preset, e.g. {dropout: 0.3}


@dataclass
class TrainingConfig:
    max_tokens: int = 4096  # token budget per batch and side, padding included (§5.1: ~25k on 8 GPUs)
    gradient_accumulation_steps: int = 1  # multiply the batch without more memory
    max_steps: int | None = None  # stop after this many updates (None: num_epochs decides); with budget_minutes: a cap
    num_epochs: float = 30.0
    # the whole run (from the command's start to its record) in this many minutes: the updates are planned from the
    # machine's measured pace, the cool-down laid over them so the rate is 0 at the last one (recipe/budget.py)
    budget_minutes: float | None = None
    max_minutes: float | None = None  # stop (with a final checkpoint) after this much wall time, wherever the schedule is
    warmup_steps: int = 4000  # Noam warm-up (§5.3), in updates
    noam_factor: float = 1.0  # Noam multiplier (§5.3 uses 1)
    # not in §5.3: the rate falls linearly to 0 over the run's last N updates, or a fraction (< 1) of them; 0: none
    cooldown_steps: int | float | None = None
    label_smoothing: float = 0.1  # eps_ls (§5.4)
    # not in the paper: BPE-dropout (Provilkov et al. 2020), each training piece split into the two its merge joined
    # with this probability, drawn anew each epoch (data/bpe_dropout.py); 0: the tokenizer's pieces as they are
    bpe_dropout: float = 0.0
    # not in the paper: R-Drop (Liang et al. 2021), each batch through the model twice and this weight on the symmetric
    # KL divergence of the two passes' outputs (recipe/rdrop.py; 5 in the authors' translation runs); 0: one pass
    rdrop_alpha: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.98
    adam_epsilon: float = 1e-9
    weight_decay: float = 0.0
    max_grad_norm: float = 0.0  # 0 = no clipping, as in the paper
    eval_steps: int = 1000  # evaluate (beam search BLEU on valid) and save a checkpoint every N updates
    logging_steps: int = 50
    keep_checkpoints: int = 5  # checkpoints kept on disk (the best by BLEU is always kept as well)
    average_last: int = 5  # average the last N checkpoints at the end (§6.1); 0 or 1: no averaging
    average_every: int | None = None  # average weight snapshots taken every N updates (None: the eval checkpoints)
    num_beams: int = 4  # beam size for validation and test (§6.1)
    length_penalty: float = 0.6  # alpha of the length penalty (§6.1), for validation, test and the saved model
    length_penalty_style: str = "transformers"  # "transformers": score / length**alpha; "gnmt": GNMT's (§6.1)
    seed: int = 1
    num_threads: int | None = None  # torch CPU threads (None: torch's default)
    # the process group's backend under torchrun / accelerate: None picks NCCL on CUDA, gloo on CPUs; "gloo" lets
    # processes of several torchrun nodes share one GPU, which NCCL refuses
    ddp_backend: str | None = None
    # what the run computes in: bf16 (bfloat16 autocast), fp16 (float16 autocast with dynamic loss scaling), fp32,
    # or auto: bf16 where the CPU/GPU computes it natively, fp16 on NVIDIA GPUs without it, else fp32 (precision.py)
    precision: str = "fp32"
    torch_compile: bool = False  # torch.compile the model: faster steps on CUDA (docs/speed.md), minutes to compile


DDP_BACKENDS = (None, "nccl", "gloo", "mpi", "ccl", "hccl", "cncl", "mccl")  # transformers' `ddp_backend` choices


@dataclass
class RunConfig:
    data: DataConfig = field(default_factory=DataConfig)
    tokenizer: TokenizerConfig = field(default_factory=TokenizerConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    training: TrainingConfig = field(default_factory=TrainingConfig)
    output_dir: str = "runs/run"
    quick: dict = field(default_factory=dict)  # dotted overrides applied by --quick

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


def _set_dotted(tree: dict, dotted: str, value: Any) -> None:
    parts = dotted.split(".")
    node = tree
    for part in parts[:-1]:
        node = node.setdefault(part, {})
        if not isinstance(node, dict):
            raise ConfigError(f"cannot set {dotted!r}: {part!r} is not a section")
    node[parts[-1]] = value


def shipped_config_names() -> list[str]:
    return sorted(path.stem for path in SHIPPED_CONFIGS.glob("*.yaml"))


def resolve_config_path(name_or_path: str) -> Path:
    """A config file path, or the name of a shipped config (`multi30k-en-de`)."""
    path = Path(name_or_path)
    if path.is_file():
        return path
    shipped = SHIPPED_CONFIGS / f"{name_or_path}.yaml"
    if shipped.is_file():
        return shipped
    raise ConfigError(f"config {name_or_path!r} is neither a file nor a shipped config "
                      f"({', '.join(shipped_config_names())})")


def _read_utf8(path: Path) -> str:
    """The text of a config file; ConfigError naming the file and the line for anything that is not UTF-8 text."""
    try:
        data = path.read_bytes()
    except OSError as error:
        raise ConfigError(f"cannot read config {path}: {error.strerror}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise ConfigError(f"{path}: line {line} is not valid UTF-8 (byte 0x{data[error.start]:02X}); save the config "
                          "as UTF-8") from None


def load_run_config(name_or_path: str | None, overrides: dict[str, Any] | None = None,
                    quick: bool = False) -> RunConfig:
    """Read a YAML config (and the configs it `extends`), apply `--quick` and dotted overrides, validate types and
    values."""
    raw = _read_config_tree(name_or_path, ()) if name_or_path is not None else {}
    if quick:
        quick_overrides = raw.get("quick") or {}
        if not quick_overrides:
            raise ConfigError("--quick given but the config has no 'quick' section")
        for dotted, value in quick_overrides.items():
            _set_dotted(raw, dotted, value)
    for dotted, value in (overrides or {}).items():
        _set_dotted(raw, dotted, value)
    if isinstance(raw.get("training"), dict):
        _precision_of_older_keys(raw["training"])
    try:
        config = from_mapping(RunConfig, raw, noun="config key")
    except MappingError as error:
        raise ConfigError(str(error)) from None
    validate(config)
    return config


def _precision_of_older_keys(training: dict) -> None:
    """`training.bf16` (true, false, auto: the key before `training.precision`, in configs and in the config.yaml of
    run folders) and `training.fp16` (true: transformers' name) still load, as the `training.precision` they mean.
    A named precision (bf16 or fp16 true, precision bf16 / fp16 / fp32) wins over `bf16: false` (float32), which wins
    over `auto`: `--training.fp16 true` on a shipped config trains in float16. Two named precisions that differ are
    refused in one line."""
    bf16, fp16 = training.pop("bf16", None), training.pop("fp16", None)
    for key, value, choices in (("bf16", bf16, "true, false or auto"), ("fp16", fp16, "true or false")):
        if value is not None and not (isinstance(value, bool) or (key == "bf16" and value == "auto")):
            raise ConfigError(f"training.{key} must be {choices} (or use training.precision: "
                              f"{', '.join(PRECISIONS)}), got {value!r}")
    named = {f"training.{key}: true": key for key, value in (("bf16", bf16), ("fp16", fp16)) if value is True}
    precision = training.get("precision")
    if precision not in (None, "auto"):
        named[f"training.precision: {precision}"] = precision
    if len(set(named.values())) > 1:
        raise ConfigError(f"{' and '.join(named)} name different precisions: keep one (training.precision: "
                          f"{', '.join(PRECISIONS)})")
    if named:
        training["precision"] = next(iter(named.values()))
    elif bf16 is False:
        training["precision"] = "fp32"
    elif bf16 == "auto":
        training["precision"] = "auto"


def _read_config_tree(name_or_path: str, seen: tuple[Path, ...]) -> dict:
    """The mapping of a config file; with `extends: OTHER` (a shipped config name or a path), OTHER's mapping with
    this file's keys merged over it, section by section."""
    path = resolve_config_path(name_or_path)
    if path.resolve() in seen:
        raise ConfigError(f"{path}: 'extends' loops back to it (" + " -> ".join(p.name for p in (*seen, path)) + ")")
    try:
        raw = yaml.safe_load(_read_utf8(path)) or {}
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: not valid YAML: {error}") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: the top level must be a mapping (sections data, tokenizer, model, training)")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    if not isinstance(parent, str):
        raise ConfigError(f"{path}: 'extends' must name one config (a shipped name or a path), got {parent!r}")
    beside = path.parent / parent  # a relative path is read from the extending file's folder first
    try:
        base = _read_config_tree(str(beside) if beside.is_file() else parent, (*seen, path.resolve()))
    except ConfigError as error:
        raise ConfigError(f"{path}: extends {parent!r}: {error}") from None
    return _merged(base, raw)


def _merged(base: dict, over: dict) -> dict:
    out = dict(base)
    for key, value in over.items():
        out[key] = _merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def validate(config: RunConfig) -> None:
    """Rules beyond types, checked before any work starts."""
    t = config.training
    for setting in dataclasses.fields(t):
        problem = setting_problem(setting.name, getattr(t, setting.name))
        if problem:
            raise ConfigError(f"training.{problem}")
    for key, value in {"tokenizer.vocab_size": config.tokenizer.vocab_size,
                       "data.valid_subset": config.data.valid_subset, "tokenizer.sample": config.tokenizer.sample,
                       }.items():
        if value is not None and (problem := positive_problem(key, value)):
            raise ConfigError(problem)
    if problem := max_length_problem(config.data.max_length):
        raise ConfigError(f"data.{problem}")
    reserved = len(SPECIAL_TOKENS) + NUM_BYTE_TOKENS  # ids the joint BPE keeps for special and byte tokens
    if config.tokenizer.path is None and config.tokenizer.vocab_size <= reserved:
        raise ConfigError(f"tokenizer.vocab_size must be above {reserved} (the special and byte tokens take "
                          f"{reserved} ids), got {config.tokenizer.vocab_size}")
    if t.average_every is not None and t.average_last < 2:
        raise ConfigError(f"training.average_every ({t.average_every}) takes snapshots for the average of the last "
                          f"training.average_last, which must then be at least 2, got {t.average_last}")
    if problem := cooldown_problem(t.cooldown_steps, t.max_steps, "training.max_steps", planned=bool(t.budget_minutes)):
        raise ConfigError(f"training.{problem}")
    if t.average_every is None and t.average_last > t.keep_checkpoints:
        raise ConfigError(f"training.average_last ({t.average_last}) cannot exceed training.keep_checkpoints "
                          f"({t.keep_checkpoints}): older checkpoints are deleted")
    padded = -(-config.data.max_length // 8) * 8 if t.torch_compile else config.data.max_length  # CUDA pads to 8
    if padded > t.max_tokens:
        shown = f"{config.data.max_length}, padded to {padded}" if padded != config.data.max_length else padded
        raise ConfigError(f"data.max_length ({shown}) exceeds training.max_tokens ({t.max_tokens}): the longest "
                          "examples would not fit in any batch")
    if config.model.preset not in PRESETS:
        raise ConfigError(f"model.preset {config.model.preset!r} is unknown; choose one of {sorted(PRESETS)}")
    known = [f.name for f in dataclasses.fields(VaswaniConfig)]
    for key in config.model.config:
        if key not in known:
            raise ConfigError(f"unknown config key 'model.config.{key}'{suggestion(key, known)}")
    try:
        model_config = VaswaniConfig.from_preset(config.model.preset, **{**config.model.config, "vocab_size": 10 ** 6})
    except ValueError as error:
        raise ConfigError(f"model.config: {error}") from None
    if model_config.max_position_embeddings < config.data.max_length:
        raise ConfigError(
            f"model.config.max_position_embeddings ({model_config.max_position_embeddings}) is below data.max_length "
            f"({config.data.max_length}): training examples of up to data.max_length tokens would not fit the model; "
            "raise max_position_embeddings or lower data.max_length")
    data_path = Path(config.data.path)
    if not is_hub_dataset_id(config.data.path) and not data_path.exists():
        hint = ""
        if "multi30k" in config.data.path.lower() or config.data.description.name == "Multi30k":
            hint = (f"; Multi30k comes from {MULTI30K_SOURCE} (data/task1/raw: train, val, test_2016_flickr .en/.de"
                    ".gz, unpacked as train, valid, test2016 .en/.de; README.md, 'Get the data')")
        raise ConfigError(f"data.path {config.data.path!r} does not exist (resolved: {data_path.resolve()}){hint}")
    if config.tokenizer.path is not None and not Path(config.tokenizer.path).is_dir():
        raise ConfigError(f"tokenizer.path {config.tokenizer.path!r} is not a folder")
    if config.data.preprocess is not None and config.data.preprocess not in PREPROCESSING:
        raise ConfigError(f"data.preprocess must be null or one of {list(PREPROCESSING)}, got "
                          f"{config.data.preprocess!r}")
    if t.ddp_backend not in DDP_BACKENDS:
        raise ConfigError(f"training.ddp_backend must be null (NCCL on CUDA, gloo on CPUs) or one of "
                          f"{', '.join(b for b in DDP_BACKENDS if b)}, got {t.ddp_backend!r}")
    if problem := workers_problem(config.data.workers):
        raise ConfigError(f"data.{problem}")
    if config.data.source_lang == config.data.target_lang:
        raise ConfigError("data.source_lang and data.target_lang must differ")


def parse_overrides(tokens: list[str]) -> dict[str, Any]:
    """`--a.b value` pairs (values parsed as YAML scalars: 300 -> int, pre -> str, null -> None)."""
    overrides: dict[str, Any] = {}
    index = 0
    while index < len(tokens):
        token = tokens[index]
        if not token.startswith("--") or len(token) == 2:
            raise ConfigError(f"expected an override like --training.max_steps 300, got {token!r}")
        key, has_equals, value = token[2:].partition("=")
        if not has_equals:
            if index + 1 >= len(tokens):
                raise ConfigError(f"override --{key} has no value")
            value = tokens[index + 1]
            index += 1
        try:
            overrides[key.replace("-", "_")] = yaml.safe_load(value)
        except yaml.YAMLError:
            overrides[key.replace("-", "_")] = value
        index += 1
    return overrides


def save_run_config(config: RunConfig, path: str | Path) -> None:
    Path(path).write_text(yaml.safe_dump(config.to_dict(), sort_keys=False, allow_unicode=True), encoding="utf-8")
