"""pytest configuration of the throwaway tree that scripts/run_transformers_tests.py lays out (it stands in for
transformers' own tests/conftest.py, which the source distribution does not hold).

Importing vaswani_mt registers the model with the Auto classes. Some mixin tests also read transformers' static tables
of model names (`test_training` leaves out the base models listed in `MODEL_MAPPING_NAMES`; `_prepare_for_class` adds
labels for the models of `MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES`): a model that lives outside transformers is
not in them, so it is added here, before the test module is imported. Only the model tables get the name: the config
table would make `AutoConfig` look for a `transformers.models.vaswani` module.
"""

from transformers.models.auto import modeling_auto

import vaswani_mt  # noqa: F401  (registers with AutoConfig, AutoModel, AutoModelForSeq2SeqLM)
from vaswani_mt import VaswaniConfig

STATIC_TABLES = {
    "MODEL_MAPPING_NAMES": "VaswaniModel",
    "MODEL_FOR_SEQ_TO_SEQ_CAUSAL_LM_MAPPING_NAMES": "VaswaniForConditionalGeneration",
}


def add_to_static_tables() -> None:
    for table, class_name in STATIC_TABLES.items():
        getattr(modeling_auto, table)[VaswaniConfig.model_type] = class_name


add_to_static_tables()
