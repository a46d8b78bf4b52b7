"""What `import vaswani_mt` provides: the public names, and the package plugged into transformers: the model registered
with the Auto classes, the fast decoding loops in the model's generate(), the "translation" pipeline task, and the
model card in `VaswaniTrainer`'s Hub pushes. `vaswani_mt/__init__.py` imports this at once, except under the
`vaswani-mt` command, whose commands import it when they run (so that `vaswani-mt --help` needs neither torch nor
transformers), and serves the names it lists (its `__all__`) from here.

Plugging in touches transformers' registries and this package's classes only: no floating-point mode, environment
variable, thread count, allocator setting or default dtype of the process changes here.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

# The public API (`__all__`, which `vaswani_mt/__init__.py` lists too) and what plugging in needs.
from .data.batching import TokenBudgetBatchSampler, padding_stats
from .data.cleaning import CleaningOptions, CleaningReport, load_parallel
from .data.reading import DataError
from .data.tokenization import normalize_text, train_tokenizer
from .data.tokenizing import tokenize_dataset
from .metrics import corpus_scores, load_metric, moses_tokenized_bleu
from .model.configuration_vaswani import PRESETS, VaswaniConfig
from .model.fast_decoding import FAST_DECODING
from .model.modeling_vaswani import (
    VaswaniForConditionalGeneration,
    VaswaniModel,
    VaswaniPreTrainedModel,
    label_smoothed_cross_entropy,
)
from .model.pipeline_vaswani import TranslationPipeline, register_translation_pipeline, save_for_pipeline
from .publishing.model_card import trainer_model_card
from .recipe.averaging import average_checkpoints, find_checkpoints
from .recipe.config import ConfigError, RunConfig, load_run_config
from .recipe.run import train_run
from .recipe.schedule import NoamLR, make_adam, noam_curve, noam_lr
from .recipe.trainer import VaswaniTrainer, VaswaniTrainingArguments
from .run_record import RunRecord

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
# save_pretrained then writes `auto_map` and copies the model code beside the weights, so a checkpoint loads with
# stock transformers and trust_remote_code=True where vaswani_mt is not installed.
VaswaniConfig.register_for_auto_class()
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")
# generate() of the package's model decodes with vaswani_mt's faster loops (same output as transformers' loops); the
# code saved beside a model does not carry them, so a folder loaded as remote code decodes with transformers' loops.
VaswaniForConditionalGeneration.decoding_loops = FAST_DECODING
# transformers 5 removed the "translation" task; bring it back, served by our TranslationPipeline.
register_translation_pipeline()
# VaswaniTrainer(push_to_hub=True) uploads vaswani_mt's model card: the publishing layer plugs it into the recipe's
# trainer here, so that the trainer does not import the layers above it.
VaswaniTrainer.card_writer = trainer_model_card

__all__ = [
    "PRESETS",
    "RunRecord",
    "CleaningOptions",
    "CleaningReport",
    "ConfigError",
    "RunConfig",
    "DataError",
    "NoamLR",
    "TokenBudgetBatchSampler",
    "TranslationPipeline",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
    "VaswaniTrainer",
    "VaswaniTrainingArguments",
    "average_checkpoints",
    "corpus_scores",
    "find_checkpoints",
    "label_smoothed_cross_entropy",
    "load_metric",
    "load_run_config",
    "load_parallel",
    "make_adam",
    "moses_tokenized_bleu",
    "noam_curve",
    "noam_lr",
    "normalize_text",
    "padding_stats",
    "register_translation_pipeline",
    "save_for_pipeline",
    "tokenize_dataset",
    "train_run",
    "train_tokenizer",
]
