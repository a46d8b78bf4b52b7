"""Configuration of the Vaswani et al. (2017) Transformer, "Attention Is All You Need"."""

import dataclasses
import difflib
import logging
from typing import ClassVar

from transformers import GenerationConfig, PreTrainedConfig

logger = logging.getLogger(__name__)


# Table 3 of the paper, plus two smaller shapes for CPU work. Only the shape lives here: the vocabulary
# size depends on the tokenizer and is passed by the caller (`from_preset("base", vocab_size=37000)`).
PRESETS: dict[str, dict] = {
    # §6.2, Table 3 "base": N=6, d_model=512, d_ff=2048, h=8, P_drop=0.1 (65M parameters with a 37k vocabulary).
    "base": dict(
        d_model=512, encoder_layers=6, decoder_layers=6, encoder_attention_heads=8, decoder_attention_heads=8,
        encoder_ffn_dim=2048, decoder_ffn_dim=2048, dropout=0.1,
    ),
    # Table 3 "big": d_model=1024, d_ff=4096, h=16, P_drop=0.3 (EN-DE; 213M parameters).
    "big": dict(
        d_model=1024, encoder_layers=6, decoder_layers=6, encoder_attention_heads=16, decoder_attention_heads=16,
        encoder_ffn_dim=4096, decoder_ffn_dim=4096, dropout=0.3,
    ),
    # A shape that trains on a 2-core CPU in an hour (Multi30k-sized data).
    "small": dict(
        d_model=256, encoder_layers=3, decoder_layers=3, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=1024, decoder_ffn_dim=1024, dropout=0.1, vocab_size=8000,
    ),
    # Wu et al. 2021 ("Good for Misconceived Reasons"), fairseq's transformer_tiny: the best published text-only
    # Transformer on Multi30k (41.0 BLEU on test2016, lowercased and tokenized), and fast on 2 CPU cores.
    "mini": dict(
        d_model=128, encoder_layers=4, decoder_layers=4, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=256, decoder_ffn_dim=256, dropout=0.3,
    ),
    # For tests: every code path, milliseconds per step.
    "tiny": dict(
        d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4, decoder_attention_heads=4,
        encoder_ffn_dim=64, decoder_ffn_dim=64, dropout=0.1, vocab_size=128, max_position_embeddings=128,
    ),
}

NORM_STYLES = ("post", "pre")
POSITION_EMBEDDINGS = ("sinusoidal", "learned")
INITIALIZATIONS = ("xavier", "fairseq")
# Text preprocessing applied to raw input before the tokenizer (the model was trained on such text); see `preprocess`.
PREPROCESSING = ("lowercase_moses",)
_POSITIVE_INTS = ("vocab_size", "d_model", "encoder_layers", "decoder_layers", "encoder_attention_heads",
                  "decoder_attention_heads", "encoder_ffn_dim", "decoder_ffn_dim", "max_position_embeddings")
_PROBABILITIES = ("dropout", "attention_dropout", "activation_dropout")
# Keyword arguments that are not fields but that transformers itself passes or writes into config.json.
_PASSED_BY_TRANSFORMERS = {"model_type", "auto_map", "custom_pipelines", "name_or_path", "output_attentions",
                           "attn_implementation", "experts_implementation", "torch_dtype", "num_labels",
                           "per_layer_config"}


def _check_field(name: str, value) -> None:
    """Raise `ValueError` naming the field and its rule when `value` is invalid for `name` on its own (rules that
    involve two fields are in `VaswaniConfig.validate_fields`)."""
    if name in _POSITIVE_INTS:
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ValueError(f"VaswaniConfig.{name} must be a positive integer, got {value!r}")
    elif name in _PROBABILITIES:
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value < 1.0:
            raise ValueError(f"VaswaniConfig.{name} must be a number in [0, 1), got {value!r}")
    elif name == "norm_style":
        if value not in NORM_STYLES:
            raise ValueError(f"VaswaniConfig.norm_style must be one of {NORM_STYLES}, got {value!r}")
    elif name in ("d_k", "d_v"):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise ValueError(
                f"VaswaniConfig.{name} must be None (d_model / heads) or a positive integer, got {value!r}")
    elif name == "position_embedding":
        if value not in POSITION_EMBEDDINGS:
            raise ValueError(f"VaswaniConfig.position_embedding must be one of {POSITION_EMBEDDINGS}, got {value!r}")
    elif name == "initialization":
        if value not in INITIALIZATIONS:
            raise ValueError(f"VaswaniConfig.initialization must be one of {INITIALIZATIONS}, got {value!r}")
    elif name == "preprocess":
        if value is not None and value not in PREPROCESSING:
            raise ValueError(f"VaswaniConfig.preprocess must be None or one of {PREPROCESSING}, got {value!r}")
    elif name == "layer_norm_eps":
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"VaswaniConfig.layer_norm_eps must be a positive number, got {value!r}")
    elif name == "activation_function":
        from transformers.activations import ACT2FN

        if value not in ACT2FN:
            raise ValueError(
                f"VaswaniConfig.activation_function {value!r} is unknown; "
                f"choose one of transformers.activations.ACT2FN, e.g. 'relu' (§3.3), 'gelu', 'swish'"
            )


class VaswaniConfig(PreTrainedConfig):
    r"""Configuration of [`VaswaniModel`] and [`VaswaniForConditionalGeneration`].

    Defaults are the paper's "base" model (Table 3) with a 37,000-token joint BPE vocabulary (§5.1).
    `VaswaniConfig.from_preset(name, **overrides)` gives the named shapes `base`, `big`, `small`, `mini`, `tiny`.

    Args:
        vocab_size (`int`, defaults to 37000):
            Size of the joint source/target vocabulary (§5.1: shared BPE vocabulary of about 37,000 tokens).
        d_model (`int`, defaults to 512):
            Width of every sub-layer output and of the embeddings (§3.1, d_model).
        encoder_layers (`int`, defaults to 6):
            Number of identical encoder layers (§3.1, N).
        decoder_layers (`int`, defaults to 6):
            Number of identical decoder layers (§3.1, N).
        encoder_attention_heads (`int`, defaults to 8):
            Attention heads per encoder attention layer (§3.2.2, h); must divide `d_model` unless `d_k` and `d_v`
            are both set.
        decoder_attention_heads (`int`, defaults to 8):
            Attention heads per decoder self- and cross-attention layer; the same rule.
        d_k (`int`, *optional*):
            Size of each head's queries and keys (§3.2.2, d_k). None: d_model / h, the paper's choice for every
            model but Table 3's rows (B), which shrink it to 16 and 32 with d_v = 64.
        d_v (`int`, *optional*):
            Size of each head's values (§3.2.2, d_v); the heads' concatenation (h * d_v) is projected back to
            d_model. None: d_model / h.
        encoder_ffn_dim (`int`, defaults to 2048):
            Inner width of the encoder's position-wise feed-forward networks (§3.3, d_ff).
        decoder_ffn_dim (`int`, defaults to 2048):
            Inner width of the decoder's position-wise feed-forward networks (§3.3, d_ff).
        activation_function (`str`, defaults to `"relu"`):
            Non-linearity between the two feed-forward projections (§3.3 uses ReLU). Any key of
            `transformers.activations.ACT2FN` works (e.g. `"swish"` for converted opus-mt models).
        dropout (`float`, defaults to 0.1):
            Residual dropout (§5.4, P_drop): applied to each sub-layer output before the residual add and to the
            sums of embeddings and positional encodings.
        attention_dropout (`float`, defaults to 0.0):
            Dropout on the attention probabilities (not in the paper; fairseq and tensor2tensor offer it).
        activation_dropout (`float`, defaults to 0.0):
            Dropout after the feed-forward non-linearity (not in the paper; fairseq's `relu_dropout`).
        max_position_embeddings (`int`, defaults to 1024):
            Number of rows of the position table (§3.5): the longest source or target sequence, in tokens, the
            model accepts. Longer inputs raise a `ValueError`.
        position_embedding (`str`, defaults to `"sinusoidal"`):
            `"sinusoidal"`: the fixed encodings of §3.5, stored nowhere. `"learned"`: a trained vector per position,
            one table per stack (Table 3, row (E); fairseq's `--encoder-learned-pos`), which cannot go beyond
            `max_position_embeddings` positions: §3.5 chose sinusoids because they may extrapolate.
        norm_style (`str`, defaults to `"post"`):
            `"post"`: LayerNorm(x + Sublayer(x)), as in the paper (§3.1). `"pre"`: x + Sublayer(LayerNorm(x)),
            with a final LayerNorm after each stack (Wang et al. 2019; trains without warm-up tricks at depth).
        initialization (`str`, defaults to `"xavier"`):
            How a new model's weight matrices start (the paper does not say). `"xavier"`: Xavier-uniform with zero
            biases everywhere (the Annotated Transformer). `"fairseq"`: fairseq's transformer: query, key and value
            projections Xavier-uniform with gain 1/sqrt(2), the feed-forward layers and those biases torch's own
            `nn.Linear` initialisation (Kaiming-uniform, a = sqrt(5): about half Xavier's scale for the second
            layer); attention output projections Xavier with zero bias. On Multi30k's `mini` shape it learned
            faster per update (docs/recipe.md). Token embeddings are N(0, d_model^-0.5) either way.
        layer_norm_eps (`float`, defaults to 1e-5):
            Epsilon of every LayerNorm (torch's default, as in `torch.nn.Transformer` and Marian).
        scale_embedding (`bool`, defaults to `True`):
            Multiply token embeddings by sqrt(d_model) (§3.4).
        share_embeddings (`bool`, defaults to `True`):
            One embedding matrix for source and target tokens (§3.4; needs the joint vocabulary of §5.1).
        tie_word_embeddings (`bool`, defaults to `True`):
            Use the (target) embedding matrix as the pre-softmax projection too (§3.4, Press & Wolf 2016).
        final_logits_bias (`bool`, defaults to `False`):
            Add a fixed bias vector to the logits. Not in the paper; it exists only so that converted
            `MarianMTModel` checkpoints (which carry one) stay exact.
        use_cache (`bool`, defaults to `True`):
            Keep decoder keys/values between generation steps.
        pad_token_id (`int`, defaults to 0), bos_token_id (`int`, defaults to 2), eos_token_id (`int`, defaults to 3):
            Special-token ids; the defaults match `vaswani_mt.train_tokenizer` (`<pad>`, `<unk>`, `<s>`, `</s>`).
        decoder_start_token_id (`int`, defaults to 2):
            First decoder input: the target is shifted right by one position behind this token (§3.1).
        is_encoder_decoder (`bool`, defaults to `True`):
            Always true; tells generic HF code (generation, Trainer) that this is a seq2seq model.
        preprocess (`str`, *optional*):
            What the training text went through before the tokenizer, so that the pipeline and `vaswani-mt
            translate` do the same to raw input: `"lowercase_moses"` (lowercased, then Moses-tokenized for
            `source_lang`; the output is then lowercased tokenized text too — the literature's Multi30k protocol).
        source_lang (`str`, *optional*), target_lang (`str`, *optional*):
            The language codes (e.g. `"en"`, `"de"`), for the language-specific rules of `preprocess` (the target's:
            for references and forced targets that are compared with, or fed to, the model).
    """

    model_type: ClassVar[str] = "vaswani"
    keys_to_ignore_at_inference: ClassVar[list[str]] = ["cache", "past_key_values"]
    attribute_map: ClassVar[dict[str, str]] = {
        "hidden_size": "d_model",
        "num_attention_heads": "encoder_attention_heads",
        "num_hidden_layers": "encoder_layers",
    }

    vocab_size: int = 37000
    d_model: int = 512
    encoder_layers: int = 6
    decoder_layers: int = 6
    encoder_attention_heads: int = 8
    decoder_attention_heads: int = 8
    encoder_ffn_dim: int = 2048
    decoder_ffn_dim: int = 2048
    d_k: int | None = None
    d_v: int | None = None
    activation_function: str = "relu"
    dropout: float = 0.1
    attention_dropout: float = 0.0
    activation_dropout: float = 0.0
    max_position_embeddings: int = 1024
    position_embedding: str = "sinusoidal"
    norm_style: str = "post"
    initialization: str = "xavier"
    layer_norm_eps: float = 1e-5
    scale_embedding: bool = True
    share_embeddings: bool = True
    tie_word_embeddings: bool = True
    final_logits_bias: bool = False
    use_cache: bool = True
    pad_token_id: int | None = 0
    bos_token_id: int | None = 2
    eos_token_id: int | list[int] | None = 3
    decoder_start_token_id: int | None = 2
    is_encoder_decoder: bool = True
    preprocess: str | None = None
    source_lang: str | None = None
    target_lang: str | None = None

    def __post_init__(self, **kwargs):
        self._warn_about_unknown_arguments(kwargs)
        super().__post_init__(**kwargs)
        self.validate_fields()

    def __setattr__(self, name, value) -> None:
        """Check a field on assignment as on construction: `config.norm_style = "sandwich"` after construction used to
        build a silently post-norm model and save a folder that could not be loaded back."""
        _check_field(type(self).attribute_map.get(name, name), value)
        super().__setattr__(name, value)

    def validate(self) -> None:
        """transformers' validation (run by `save_pretrained`) and ours, including the rules between fields, so that no
        config that would fail to load is ever written."""
        super().validate()
        self.validate_fields()

    @classmethod
    def _warn_about_unknown_arguments(cls, kwargs: dict) -> None:
        """Like transformers' configs, keep unknown keyword arguments as attributes (config.json files may carry keys
        of other tools), but say so: a typo such as `d_modle=256` would otherwise silently build the default shape."""
        fields = [field.name for field in dataclasses.fields(cls)]
        known = set(fields) | set(cls.attribute_map) | _PASSED_BY_TRANSFORMERS | set(GenerationConfig().to_dict())
        for key in kwargs:
            if key not in known and not key.startswith("_"):
                close = difflib.get_close_matches(key, fields, n=1)
                logger.warning("VaswaniConfig: unknown argument %r%s; it is kept as an attribute, but the model does "
                               "not use it", key, f" (did you mean {close[0]!r}?)" if close else "")

    def validate_fields(self) -> None:
        """Raise `ValueError` naming the field and the rule for any invalid value."""
        for name in (*_POSITIVE_INTS, *_PROBABILITIES, "norm_style", "layer_norm_eps", "activation_function",
                     "preprocess", "d_k", "d_v", "position_embedding", "initialization"):
            _check_field(name, getattr(self, name))
        for name in ("encoder_attention_heads", "decoder_attention_heads"):
            heads = getattr(self, name)
            unset = [field for field in ("d_k", "d_v") if getattr(self, field) is None]
            if unset and self.d_model % heads:
                raise ValueError(
                    f"VaswaniConfig.d_model ({self.d_model}) must be divisible by {name} ({heads}): "
                    f"{' and '.join(unset)} unset means d_model / heads dimensions per head (§3.2.2)"
                )
        for name in ("pad_token_id", "bos_token_id", "decoder_start_token_id"):
            value = getattr(self, name)
            if value is not None and not 0 <= value < self.vocab_size:
                raise ValueError(f"VaswaniConfig.{name} ({value}) must lie in [0, vocab_size={self.vocab_size})")
        if self.preprocess is not None and not self.source_lang:
            raise ValueError(f"VaswaniConfig.preprocess={self.preprocess!r} needs source_lang (its rules depend on it)")

    def head_sizes(self, heads: int) -> tuple[int, int]:
        """(d_k, d_v) of an attention layer with `heads` heads: the fields where set, else d_model / heads."""
        return self.d_k or self.d_model // heads, self.d_v or self.d_model // heads

    @classmethod
    def from_preset(cls, name: str, **overrides) -> "VaswaniConfig":
        """A config of a named shape: `"base"` and `"big"` are the paper's Table 3; `"small"` and `"mini"` are
        for CPUs (`"mini"`: the best published Multi30k shape), `"tiny"` for tests. Keyword arguments override any
        field (e.g. `vocab_size=8000, norm_style="pre"`)."""
        if name not in PRESETS:
            raise ValueError(f"unknown preset {name!r}; choose one of {sorted(PRESETS)}")
        return cls(**{**PRESETS[name], **overrides})


__all__ = ["VaswaniConfig", "PRESETS", "POSITION_EMBEDDINGS"]
