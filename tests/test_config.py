"""VaswaniConfig: the paper's shapes, HF field names, and clear errors for invalid values."""

import re

import pytest
from transformers import AutoConfig

from vaswani_mt import VaswaniConfig


def test_base_and_big_presets_are_the_papers_table_3():
    base = VaswaniConfig.from_preset("base")
    assert (base.d_model, base.encoder_ffn_dim, base.encoder_attention_heads, base.encoder_layers,
            base.decoder_layers, base.dropout) == (512, 2048, 8, 6, 6, 0.1)
    big = VaswaniConfig.from_preset("big")
    assert (big.d_model, big.decoder_ffn_dim, big.decoder_attention_heads, big.encoder_layers, big.dropout) == (
        1024, 4096, 16, 6, 0.3)
    small = VaswaniConfig.from_preset("small")
    assert (small.d_model, small.encoder_layers, small.encoder_attention_heads, small.encoder_ffn_dim) == (
        256, 3, 4, 1024)


def test_paper_defaults_post_norm_shared_and_tied_embeddings():
    config = VaswaniConfig()
    assert config.norm_style == "post"
    assert config.share_embeddings and config.tie_word_embeddings and config.scale_embedding
    assert config.activation_function == "relu"


def test_presets_take_overrides_and_unknown_presets_are_named():
    assert VaswaniConfig.from_preset("tiny", vocab_size=500, norm_style="pre").vocab_size == 500
    with pytest.raises(ValueError, match="unknown preset 'huge'"):
        VaswaniConfig.from_preset("huge")


def test_generic_hf_names_map_to_the_fields():
    config = VaswaniConfig.from_preset("tiny", encoder_layers=2, decoder_layers=3)
    assert config.hidden_size == config.d_model
    assert config.num_attention_heads == config.encoder_attention_heads
    assert config.num_hidden_layers == 2
    assert config.get_text_config(decoder=True).num_hidden_layers == 3


@pytest.mark.parametrize("overrides,field", [
    (dict(d_model=30, encoder_attention_heads=4), "encoder_attention_heads"),
    (dict(d_model=32, decoder_attention_heads=5), "decoder_attention_heads"),
    (dict(norm_style="sandwich"), "norm_style"),
    (dict(initialization="kaiming"), "initialization"),
    (dict(dropout=1.0), "dropout"),
    (dict(attention_dropout=-0.1), "attention_dropout"),
    (dict(d_model=0), "d_model"),
    (dict(encoder_layers=-1), "encoder_layers"),
    (dict(vocab_size=2.5), "vocab_size"),
    (dict(activation_function="nope"), "activation_function"),
    (dict(pad_token_id=1000), "pad_token_id"),
])
def test_invalid_values_raise_value_error_naming_the_field(overrides, field):
    with pytest.raises(ValueError, match=field):
        VaswaniConfig.from_preset("tiny", **overrides)


def test_every_field_is_documented_in_the_class_docstring():
    own_fields = [name for name in VaswaniConfig.__annotations__ if not name.startswith("_")]
    own_fields = [name for name in own_fields if name not in ("model_type", "keys_to_ignore_at_inference",
                                                              "attribute_map")]
    undocumented = [name for name in own_fields if not re.search(rf"\b{name}\b", VaswaniConfig.__doc__)]
    assert not undocumented


def test_config_round_trips_through_save_and_auto_config(tmp_path):
    config = VaswaniConfig.from_preset("tiny", norm_style="pre", share_embeddings=False)
    config.save_pretrained(tmp_path)
    loaded = AutoConfig.from_pretrained(tmp_path)
    assert isinstance(loaded, VaswaniConfig)
    ignore = {"_name_or_path"}
    assert {k: v for k, v in loaded.to_dict().items() if k not in ignore} == {
        k: v for k, v in config.to_dict().items() if k not in ignore}


# --- the Python API refuses what it cannot build or save (issue #12) ---------------------------------------------


def test_a_field_set_after_construction_is_checked_like_one_given_to_the_constructor():
    from vaswani_mt import VaswaniForConditionalGeneration

    config = VaswaniConfig.from_preset("tiny")
    with pytest.raises(ValueError, match="norm_style must be one of"):
        config.norm_style = "sandwich"
    with pytest.raises(ValueError, match="d_model must be a positive integer"):
        config.hidden_size = 0  # through the generic HF name too
    assert (config.norm_style, config.d_model) == ("post", 32)  # unchanged
    config.norm_style = "pre"
    model = VaswaniForConditionalGeneration(config)
    assert model.model.encoder.layer_norm is not None  # a pre-norm model, as asked


def test_a_config_made_inconsistent_after_construction_is_not_saved(tmp_path):
    config = VaswaniConfig.from_preset("tiny")
    config.encoder_attention_heads = 5  # fine on its own, not with d_model=32
    with pytest.raises(ValueError, match="divisible by encoder_attention_heads"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


def test_an_unknown_keyword_argument_warns_naming_the_closest_field(caplog):
    config = VaswaniConfig.from_preset("tiny", d_modle=256)
    assert config.d_model == 32
    assert "unknown argument 'd_modle' (did you mean 'd_model'?)" in caplog.text


def test_loading_a_saved_config_warns_about_nothing(tmp_path, caplog):
    VaswaniConfig.from_preset("tiny", norm_style="pre").save_pretrained(tmp_path)
    AutoConfig.from_pretrained(tmp_path)
    VaswaniConfig.from_dict(VaswaniConfig.from_preset("tiny").to_dict())
    assert "unknown argument" not in caplog.text


def test_a_run_config_that_is_not_utf8_is_named_with_its_line(tmp_path):
    from vaswani_mt.recipe.config import ConfigError, load_run_config

    path = tmp_path / "latin1.yaml"
    path.write_bytes("output_dir: runs/x\n# caf\u00e9\n".encode("latin-1"))
    with pytest.raises(ConfigError, match=rf"{re.escape(str(path))}: line 2 is not valid UTF-8 \(byte 0xE9\)"):
        load_run_config(str(path))


def test_max_position_embeddings_below_the_training_max_length_is_a_config_error(tmp_path):
    from vaswani_mt.recipe.config import ConfigError, load_run_config

    with pytest.raises(ConfigError, match=r"max_position_embeddings \(128\) is below data.max_length \(256\)"):
        load_run_config(None, {"data.path": str(tmp_path), "model.preset": "tiny", "data.max_length": 256})


def test_the_data_description_is_a_typed_section_and_the_multi30k_configs_fill_it_in(tmp_path):
    from vaswani_mt.recipe.config import ConfigError, load_run_config

    for name in ("multi30k-en-de", "multi30k-de-en"):
        description = load_run_config(name, {"data.path": str(tmp_path)}).data.description
        assert description.name == "Multi30k" and "non-commercial" in description.terms
        assert description.citation.startswith("@inproceedings{elliott-etal-2016-multi30k")
    plain = load_run_config(None, {"data.path": str(tmp_path), "data.description.name": "My corpus"})
    assert plain.data.description.name == "My corpus" and plain.data.description.terms is None
    with pytest.raises(ConfigError, match="unknown config key 'data.description.citaton'; did you mean 'citation'"):
        load_run_config(None, {"data.path": str(tmp_path), "data.description.citaton": "@misc{x}"})
    with pytest.raises(ConfigError, match="config key 'data.description.terms' must be of type"):
        load_run_config(None, {"data.path": str(tmp_path), "data.description.terms": 3})


# -- configs that extend others -----------------------------------------------------------------------------------

def test_the_shipped_de_en_config_is_the_en_de_one_with_the_languages_swapped_and_its_runs_dropout():
    from vaswani_mt.recipe.config import load_run_config

    en_de, de_en = load_run_config("multi30k-en-de").to_dict(), load_run_config("multi30k-de-en").to_dict()
    assert (de_en["data"]["source_lang"], de_en["data"]["target_lang"]) == ("de", "en")
    assert (en_de["model"]["config"]["dropout"], de_en["model"]["config"]["dropout"]) == (0.3, 0.2)
    for config in (en_de, de_en):
        del config["data"]["source_lang"], config["data"]["target_lang"], config["output_dir"]
        del config["model"]["config"]["dropout"]
        config["quick"].pop("output_dir")
    assert de_en == en_de


def test_the_shipped_cpu_protocol_config_is_the_en_de_one_on_lowercased_tokenized_text():
    from vaswani_mt.recipe.config import load_run_config

    # multi30k-en-de-lctok-cpu: the cased CPU recipe (4,096 tokens, time budget, cool-down, punctuation split,
    # fairseq's initialisation, dropout 0.3) on multi30k-en-de-lctok's lowercased tokenized data
    en_de, cpu = load_run_config("multi30k-en-de").to_dict(), load_run_config("multi30k-en-de-lctok-cpu").to_dict()
    assert (en_de["data"]["preprocess"], cpu["data"]["preprocess"]) == (None, "lowercase_moses")
    assert (en_de["training"]["keep_checkpoints"], cpu["training"]["keep_checkpoints"]) == (5, 10)
    assert (cpu["tokenizer"]["split_punctuation"], cpu["model"]["config"]["initialization"]) == (True, "fairseq")
    for config in (en_de, cpu):
        del config["data"]["preprocess"], config["training"]["keep_checkpoints"], config["output_dir"]
        config["quick"].pop("output_dir")
    assert cpu == en_de


def test_a_config_extends_another_section_by_section_and_its_own_keys_win(tmp_path):
    from vaswani_mt.recipe.config import load_run_config

    (tmp_path / "mine.yaml").write_text("extends: multi30k-en-de\ntraining:\n  warmup_steps: 123\n"
                                        "model:\n  config:\n    norm_style: pre\n")
    (tmp_path / "child.yaml").write_text("extends: mine.yaml\ntraining:\n  seed: 9\n")  # beside the file
    config = load_run_config(str(tmp_path / "child.yaml"))
    shipped = load_run_config("multi30k-en-de")
    assert (config.training.warmup_steps, config.training.seed, config.model.config) == (
        123, 9, {**shipped.model.config, "norm_style": "pre"})
    assert config.training.max_tokens == shipped.training.max_tokens and config.data == shipped.data


def test_an_extends_loop_or_a_bad_extends_value_is_refused_naming_the_file(tmp_path):
    from vaswani_mt.recipe.config import ConfigError, load_run_config

    (tmp_path / "a.yaml").write_text("extends: b.yaml\n")
    (tmp_path / "b.yaml").write_text("extends: a.yaml\n")
    with pytest.raises(ConfigError, match="'extends' loops back to it"):
        load_run_config(str(tmp_path / "a.yaml"))
    (tmp_path / "c.yaml").write_text("extends: [a, b]\n")
    with pytest.raises(ConfigError, match="'extends' must name one config"):
        load_run_config(str(tmp_path / "c.yaml"))
    (tmp_path / "d.yaml").write_text("extends: no-such-config\n")
    with pytest.raises(ConfigError, match="'no-such-config' is neither a file nor a shipped config"):
        load_run_config(str(tmp_path / "d.yaml"))


def test_the_protocol_config_reproduces_the_published_recipe():
    from vaswani_mt.model.configuration_vaswani import VaswaniConfig
    from vaswani_mt.recipe.config import load_run_config
    from vaswani_mt.recipe.schedule import noam_lr

    config = load_run_config("multi30k-en-de-lctok")
    shape = VaswaniConfig.from_preset(config.model.preset, **config.model.config)
    assert (shape.d_model, shape.encoder_ffn_dim, shape.encoder_layers, shape.decoder_layers,
            shape.encoder_attention_heads, shape.dropout) == (128, 256, 4, 4, 4, 0.3)
    t = config.training
    assert config.data.preprocess == "lowercase_moses" and (t.max_steps, t.warmup_steps, t.num_beams) == (8000, 2000, 5)
    peak = noam_lr(t.warmup_steps, d_model=shape.d_model, warmup_steps=t.warmup_steps, factor=t.noam_factor)
    assert peak == pytest.approx(0.005, rel=0.01)


def test_the_protocol_config_averages_the_weights_of_its_last_ten_epochs():
    from vaswani_mt.recipe.config import load_run_config

    t = load_run_config("multi30k-en-de-lctok").training
    updates_per_epoch = t.max_steps / 140  # Wu et al.'s 8,000 updates are ~140 Multi30k epochs at 8,192 tokens
    assert t.average_last == 10 and t.average_every == round(updates_per_epoch)


def test_the_cpu_configs_average_the_weights_of_their_last_ten_epochs_and_quick_runs_average_too():
    from vaswani_mt.recipe.config import load_run_config

    for name in ("multi30k-en-de", "multi30k-de-en"):
        t = load_run_config(name).training
        # 111 token-budget batches of 4,096 tokens make one epoch of Multi30k's training split (docs/recipe.md).
        assert (t.max_tokens, t.average_every, t.average_last) == (4096, 111, 10), name
        quick = load_run_config(name, quick=True).training
        assert quick.average_every and quick.average_last > 1, name


def test_the_cpu_configs_plan_within_a_time_budget_and_cool_down_over_their_last_updates():
    from vaswani_mt.recipe.config import load_run_config

    for name in ("multi30k-en-de", "multi30k-de-en", "multi30k-en-de-lctok-cpu"):
        full, quick = load_run_config(name).training, load_run_config(name, quick=True).training
        # 80 minutes on any CPU; the cool-down is the share 2,000 of 9,000 updates had (docs/recipe.md)
        assert (full.budget_minutes, full.max_steps, full.max_minutes, full.cooldown_steps) == (80, None, None, 0.22)
        assert (quick.budget_minutes, quick.cooldown_steps) == (3, 0.22), name  # --quick: planned the same way
    hindi, quick = load_run_config("tatoeba-en-hi").training, load_run_config("tatoeba-en-hi", quick=True).training
    assert (hindi.budget_minutes, hindi.max_steps, hindi.cooldown_steps) == (6, 1500, 0.2)
    assert (quick.budget_minutes, quick.max_steps) == (2, None)


def test_the_gpu_configs_are_step_exact_and_the_protocol_config_has_no_cooldown():
    from vaswani_mt.recipe.config import load_run_config

    for quick in (False, True):  # Wu et al.'s inverse-sqrt schedule has none, though the config extends multi30k-en-de
        assert load_run_config("multi30k-en-de-lctok", quick=quick).training.cooldown_steps is None
    t = load_run_config("multi30k-en-de-lctok").training
    assert (t.max_steps, t.budget_minutes) == (8000, None)
    assert load_run_config("wmt14-en-de-base", {"data.path": "."}).training.budget_minutes is None


def test_en_de_and_the_protocol_configs_train_with_dropout_0_3_de_en_with_its_runs_0_2_and_quick_runs_keep_0_2():
    from vaswani_mt.model.configuration_vaswani import VaswaniConfig
    from vaswani_mt.recipe.config import load_run_config

    def dropout(name, quick):
        config = load_run_config(name, quick=quick)
        return VaswaniConfig.from_preset(config.model.preset, **config.model.config).dropout

    # 0.3 is within 0.8 of 0.2 at the slower CPUs' budgets and leads where a CPU makes ~15,000 updates (docs/recipe.md);
    # multi30k-en-de-lctok-cpu inherits it; multi30k-de-en extends multi30k-en-de but keeps the 0.2 its documented
    # seeds ran with; --quick's few hundred updates train with 0.2 in every config, 0.3 trailing it early
    assert (dropout("multi30k-en-de", False), dropout("multi30k-en-de-lctok", False)) == (0.3, 0.3)
    assert (dropout("multi30k-en-de-lctok-cpu", False), dropout("multi30k-de-en", False)) == (0.3, 0.2)
    for name in ("multi30k-en-de", "multi30k-de-en", "multi30k-en-de-lctok-cpu", "multi30k-en-de-lctok"):
        assert dropout(name, True) == 0.2


def test_the_multi30k_configs_decode_with_beam_5_alpha_1_and_the_wmt_config_with_the_papers_beam_4_alpha_0_6():
    from vaswani_mt.recipe.config import load_run_config

    for name in ("multi30k-en-de", "multi30k-de-en", "multi30k-en-de-lctok"):
        for quick in (False, True):
            t = load_run_config(name, quick=quick).training
            assert (t.num_beams, t.length_penalty, t.length_penalty_style) == (5, 1.0, "transformers"), name
    t = load_run_config("wmt14-en-de-base").training
    assert (t.num_beams, t.length_penalty, t.length_penalty_style) == (4, 0.6, "transformers")  # §6.1


def test_a_missing_multi30k_folder_says_where_multi30k_comes_from(tmp_path):
    from vaswani_mt.recipe.config import ConfigError, load_run_config, parse_overrides

    with pytest.raises(ConfigError, match=r"does not exist .*Multi30k comes from https://github.com/multi30k/dataset"):
        load_run_config("multi30k-en-de", parse_overrides(["--data.path", str(tmp_path / "multi30k")]))
