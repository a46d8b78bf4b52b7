"""The paper's Table 3 as configuration: every row builds from an override, rows (B) (d_k, d_v) and (E) (learned
positions) included; each setting saves, loads, trains, decodes alike with both loops and as remote code (and equals
torch.nn.Transformer: tests/test_model_equivalence.py); docs/model.md's counts are the model's, near the paper's."""

import json
import math
import re
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from stock_transformers import run_without_vaswani_mt
from test_fast_decoding import _both
from test_remote_code import LOAD_AND_GENERATE
from test_train_cli import small_corpus, tiny_config  # noqa: F401 - a fixture, used by name
from vaswani_mt import VaswaniConfig, VaswaniForConditionalGeneration
from vaswani_mt.model.convert import to_marian
from vaswani_mt.recipe.config import parse_overrides

ROOT = Path(__file__).resolve().parent.parent
TABLE_ROW = re.compile(r"^\| (base|\([A-E]\)|big) \| ([^|]+) \| `?([^`|]+)`? \|\s*(\d*)\s*\| ([\d.]+) \|$")
VOCABULARY = 37000  # §5.1, the base row's shared vocabulary
# The variations that change the model's code path (rows (B) and (E)), on the tiny shape (d_model 32, 4 heads).
VARIANTS = {"d_k 4, d_v 12": dict(d_k=4, d_v=12), "d_k 16": dict(d_k=16), "learned positions":
            dict(position_embedding="learned"), "both": dict(d_k=4, d_v=12, position_embedding="learned")}


def docs_rows() -> list[dict]:
    rows = []
    for line in (ROOT / "docs" / "model.md").read_text(encoding="utf-8").splitlines():
        match = TABLE_ROW.match(line)
        if match:
            row, setting, override, paper, ours = match.groups()
            tokens = [] if override == "(none)" else override.split()
            rows.append(dict(row=row, setting=setting, overrides=parse_overrides(tokens),
                             paper=int(paper) if paper else None, ours=float(ours)))
    return rows


def model_config_of(overrides: dict) -> VaswaniConfig:
    fields = {key.removeprefix("model.config."): value for key, value in overrides.items()
              if key.startswith("model.config.")}
    return VaswaniConfig.from_preset(overrides.get("model.preset", "base"), vocab_size=VOCABULARY, **fields)


def parameter_count(config: VaswaniConfig) -> int:
    with torch.device("meta"):
        return sum(p.numel() for p in VaswaniForConditionalGeneration(config).parameters())


def embedding_free_count(config: VaswaniConfig) -> int:
    return parameter_count(config) - config.vocab_size * config.d_model


# -- the table in docs/model.md ---------------------------------------------------------------------------------------

def test_the_docs_table_has_every_row_of_the_papers_table_3():
    rows = docs_rows()
    assert [row["row"] for row in rows] == ["base"] + ["(A)"] * 4 + ["(B)"] * 2 + ["(C)"] * 7 + ["(D)"] * 4 + \
        ["(E)", "big"]


def test_every_override_in_the_docs_is_accepted_by_the_run_config(tmp_path):
    from vaswani_mt import load_run_config

    for row in docs_rows():
        config = load_run_config("wmt14-en-de-base", {**row["overrides"], "data.path": str(tmp_path)})
        for key, value in row["overrides"].items():
            section, *rest = key.split(".")
            node = getattr(config, section)
            for part in rest[:-1]:
                node = node[part] if isinstance(node, dict) else getattr(node, part)
            assert (node[rest[-1]] if isinstance(node, dict) else getattr(node, rest[-1])) == value, key


def test_each_count_in_the_docs_is_what_the_model_built_by_its_override_reports():
    for row in docs_rows():
        assert round(parameter_count(model_config_of(row["overrides"])) / 1e6, 1) == row["ours"], row


def test_each_count_lies_within_5_percent_or_2_5m_of_the_papers_figure():
    for row in (row for row in docs_rows() if row["paper"] is not None):
        ours, paper = parameter_count(model_config_of(row["overrides"])), row["paper"] * 1e6
        assert abs(ours - paper) <= max(0.05 * paper, 2.5e6), row


def test_the_papers_figures_imply_one_embedding_size_for_every_row_but_big():
    """What docs/model.md says of the difference: each figure, rounded to 1M, bounds the embedding rows beside our
    count of everything else; the bounds of all rows but big overlap in 40,932-41,160, big's lie at 35,296-36,272."""
    low, high, big = 0, math.inf, None
    for row in (row for row in docs_rows() if row["paper"] is not None):
        config = model_config_of(row["overrides"])
        rest = embedding_free_count(config)
        bounds = [((row["paper"] + half) * 1e6 - rest) / config.d_model for half in (-0.5, 0.5)]
        if row["row"] == "big":
            big = tuple(math.ceil(bound) if i == 0 else math.floor(bound) for i, bound in enumerate(bounds))
        else:
            low, high = max(low, bounds[0]), min(high, bounds[1])
    assert (math.ceil(low), math.floor(high)) == (40932, 41160)
    assert big == (35296, 36272)


# -- d_k and d_v (row B) -----------------------------------------------------------------------------------------------

def test_d_k_and_d_v_size_the_projections_and_the_scaling():
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", d_k=4, d_v=12))
    attention = model.model.encoder.layers[0].self_attn
    assert (attention.q_proj.out_features, attention.k_proj.out_features) == (4 * 4, 4 * 4)
    assert (attention.v_proj.out_features, attention.out_proj.in_features) == (4 * 12, 4 * 12)
    assert attention.scaling == 4**-0.5


def test_unset_d_k_and_d_v_are_d_model_over_heads_as_before():
    config = VaswaniConfig.from_preset("tiny")
    assert (config.d_k, config.d_v, config.position_embedding) == (None, None, "sinusoidal")
    attention = VaswaniForConditionalGeneration(config).model.decoder.layers[0].encoder_attn
    assert (attention.head_dim, attention.value_dim, attention.q_proj.out_features) == (8, 8, 32)


def test_heads_need_not_divide_d_model_when_d_k_and_d_v_are_both_set():
    assert VaswaniConfig.from_preset("tiny", encoder_attention_heads=3, decoder_attention_heads=3, d_k=8, d_v=8)
    with pytest.raises(ValueError, match=r"divisible by encoder_attention_heads \(3\): d_v unset"):
        VaswaniConfig.from_preset("tiny", encoder_attention_heads=3, decoder_attention_heads=3, d_k=8)


@pytest.mark.parametrize("field,value,message", [
    ("d_k", 0, "VaswaniConfig.d_k must be None (d_model / heads) or a positive integer, got 0"),
    ("d_v", "64", "VaswaniConfig.d_v must be None (d_model / heads) or a positive integer, got '64'"),
    ("position_embedding", "rotary", "VaswaniConfig.position_embedding must be one of ('sinusoidal', 'learned')"),
])
def test_a_bad_head_size_or_position_kind_is_named(field, value, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        VaswaniConfig.from_preset("tiny", **{field: value})
    config = VaswaniConfig.from_preset("tiny")
    with pytest.raises(ValueError, match=re.escape(message)):
        setattr(config, field, value)


@torch.no_grad()
def test_attention_with_own_d_k_and_d_v_is_the_papers_multi_head_formula_head_by_head():
    """§3.2.2: MultiHead(Q, K, V) = Concat(head_1..h) W^O, head_i = softmax(Q W_i^Q (K W_i^K)^T / sqrt(d_k)) V W_i^V,
    with W_i^Q, W_i^K of d_model x d_k and W_i^V of d_model x d_v, computed here one head at a time."""
    torch.manual_seed(0)
    config = VaswaniConfig.from_preset("tiny", d_k=4, d_v=12, attention_dropout=0.0)
    attention = VaswaniForConditionalGeneration(config).eval().model.decoder.layers[0].encoder_attn
    queries, memory = torch.randn(2, 5, 32), torch.randn(2, 7, 32)
    ours = attention(queries, key_value_states=memory)[0]
    heads = []
    for i in range(4):
        q_rows, v_rows = slice(4 * i, 4 * i + 4), slice(12 * i, 12 * i + 12)
        q = queries @ attention.q_proj.weight[q_rows].T + attention.q_proj.bias[q_rows]
        k = memory @ attention.k_proj.weight[q_rows].T + attention.k_proj.bias[q_rows]
        v = memory @ attention.v_proj.weight[v_rows].T + attention.v_proj.bias[v_rows]
        heads.append(torch.softmax(q @ k.transpose(1, 2) / math.sqrt(4), dim=-1) @ v)
    theirs = attention.out_proj(torch.cat(heads, dim=-1))
    assert (ours - theirs).abs().max() < 1e-5


# -- learned positions (row E) -----------------------------------------------------------------------------------------

def test_learned_positions_are_one_trained_table_per_stack_saved_with_the_weights(tmp_path):
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", position_embedding="learned"))
    encoder, decoder = model.model.encoder.embed_positions.weight, model.model.decoder.embed_positions.weight
    assert encoder.shape == decoder.shape == (128, 32) and encoder is not decoder
    assert encoder.requires_grad and 0.1 < encoder.std().item() < 0.25  # N(0, d_model^-0.5), as token embeddings
    model.save_pretrained(tmp_path)
    saved = load_file(tmp_path / "model.safetensors")
    assert torch.equal(saved["model.encoder.embed_positions.weight"], encoder.detach())
    assert torch.equal(saved["model.decoder.embed_positions.weight"], decoder.detach())
    sinusoidal = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny"))
    assert sum(p.numel() for p in model.parameters()) - sum(p.numel() for p in sinusoidal.parameters()) == 2 * 128 * 32


def test_a_sequence_longer_than_the_learned_table_is_refused_in_one_line():
    model = VaswaniForConditionalGeneration(VaswaniConfig.from_preset("tiny", position_embedding="learned"))
    with pytest.raises(ValueError, match="sequence of 129 tokens is longer than max_position_embeddings=128"):
        model(input_ids=torch.full((1, 129), 5), decoder_input_ids=torch.full((1, 2), 2))


# -- each setting through the whole product ----------------------------------------------------------------------------

@pytest.mark.parametrize("variant", VARIANTS.values(), ids=VARIANTS.keys())
def test_each_setting_saves_loads_and_decodes_alike_with_our_loops_and_transformers(variant, make_tiny_model,
                                                                                     padded_batch, tmp_path):
    model = make_tiny_model(**variant)
    model.save_pretrained(tmp_path)
    saved = json.loads((tmp_path / "config.json").read_text())
    assert {key: saved[key] for key in variant} == variant
    loaded = VaswaniForConditionalGeneration.from_pretrained(tmp_path).eval()
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        assert torch.equal(model(**inputs, decoder_input_ids=inputs["input_ids"][:, :4]).logits,
                           loaded(**inputs, decoder_input_ids=inputs["input_ids"][:, :4]).logits)
    for call in (dict(num_beams=1), dict(num_beams=4, length_penalty=0.6), dict(num_beams=3, num_return_sequences=2)):
        fast, reference = _both(loaded, inputs, max_new_tokens=10, **call)
        assert torch.equal(fast, reference), call
    loaded.use_fast_decoding = False  # transformers' loops with and without their cache
    assert torch.equal(loaded.generate(**inputs, max_new_tokens=10, num_beams=4),
                       loaded.generate(**inputs, max_new_tokens=10, num_beams=4, use_cache=False))


@pytest.mark.parametrize("variant", [VARIANTS["both"]], ids=["d_k, d_v and learned positions"])
def test_each_setting_generates_the_same_as_remote_code_without_the_package(variant, make_tiny_model, padded_batch,
                                                                            tmp_path):
    model = make_tiny_model(**variant)
    model.save_pretrained(tmp_path / "checkpoint")
    inputs = {k: padded_batch[k].tolist() for k in ("input_ids", "attention_mask")}
    expected = model.generate(**{k: torch.tensor(v) for k, v in inputs.items()}, max_new_tokens=12)
    result = run_without_vaswani_mt(LOAD_AND_GENERATE, str(tmp_path / "checkpoint"), json.dumps(inputs),
                                    home=tmp_path / "hf")
    assert result["output"] == expected.tolist()


def test_a_folder_saved_before_these_fields_existed_loads_as_sinusoidal_with_d_model_over_heads():
    folder = ROOT / "tests" / "fixtures" / "saved-with-transformers-5.24"
    assert "d_k" not in json.loads((folder / "config.json").read_text())
    config = VaswaniConfig.from_pretrained(folder)
    assert (config.d_k, config.d_v, config.position_embedding) == (None, None, "sinusoidal")


def test_a_run_trains_rows_b_and_e_from_overrides_and_its_card_says_so(tmp_path, small_corpus):  # noqa: F811
    from vaswani_mt import load_run_config, train_run
    from vaswani_mt.publishing.model_card import render_model_card

    overrides = {"model.config.d_k": 4, "model.config.d_v": 12, "model.config.position_embedding": "learned"}
    record = train_run(load_run_config(str(tiny_config(tmp_path, small_corpus, max_steps=4)), overrides))
    assert record.training.steps == 4
    run_dir = tmp_path / "run"
    model = VaswaniForConditionalGeneration.from_pretrained(run_dir / "model")
    assert (model.config.d_k, model.config.d_v, model.config.position_embedding) == (4, 12, "learned")
    torch.manual_seed(3)  # the run's seed (tiny_config): the weights it started from
    initial = VaswaniForConditionalGeneration(model.config).model.encoder.embed_positions.weight
    assert initial.shape == model.model.encoder.embed_positions.weight.shape
    assert not torch.equal(initial, model.model.encoder.embed_positions.weight)  # trained, and saved
    card = render_model_card(run_dir)
    assert "| Head sizes (d_k, d_v) | 4, 12 |" in card
    assert "| Positions | learned, one table per stack (Table 3 (E)), at most 128 tokens |" in card


# -- what the conversions cannot carry ---------------------------------------------------------------------------------

@pytest.mark.parametrize("variant,message", [
    (dict(d_k=4), "VaswaniConfig.d_k=4 does not convert to Marian: its heads have d_model / heads = 8 dimensions"),
    (dict(d_v=16), "VaswaniConfig.d_v=16 does not convert to Marian"),
    (dict(position_embedding="learned"),
     "VaswaniConfig.position_embedding='learned' does not convert to Marian: Marian's positions are sinusoids"),
])
def test_to_marian_refuses_what_marian_cannot_compute_naming_the_field(variant, message, make_tiny_model):
    with pytest.raises(ValueError, match=re.escape(message)):
        to_marian(make_tiny_model(**variant))


def test_to_marian_converts_d_k_and_d_v_set_to_d_model_over_heads(make_tiny_model, padded_batch):
    model = make_tiny_model(d_k=8, d_v=8)
    marian = to_marian(model).eval()
    inputs = {k: padded_batch[k] for k in ("input_ids", "attention_mask")}
    with torch.no_grad():
        ours = model(**inputs, decoder_input_ids=inputs["input_ids"][:, :4]).logits
        theirs = marian(**inputs, decoder_input_ids=inputs["input_ids"][:, :4]).logits
    assert (ours - theirs).abs().max() < 1e-5
