"""Stand-in for transformers' `tests/utils/test_configuration_utils.py`, which `tests/test_configuration_common.py`
imports `config_common_kwargs` from but which the source distribution does not hold.

`ConfigTester.check_config_arguments_init` builds the config with these keyword arguments and checks that each one
comes back as given (`dtype` as `torch.float16`). They are the arguments every `PreTrainedConfig` takes (its own
fields, in transformers 5.17 to 5.24), each with a value other than its default."""

config_common_kwargs = {
    "return_dict": False,
    "output_hidden_states": True,
    "dtype": "float16",
    "chunk_size_feed_forward": 5,
    "architectures": ["VaswaniForConditionalGeneration"],
    "id2label": {0: "first", 1: "second", 2: "third"},
    "label2id": {"first": 0, "second": 1, "third": 2},
    "problem_type": "regression",
}
