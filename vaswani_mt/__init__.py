"""vaswani_mt: the "Attention Is All You Need" Transformer (Vaswani et al. 2017) as a native Hugging Face model.

Importing the package registers the model with transformers' Auto classes, so that
`AutoConfig`, `AutoModel` and `AutoModelForSeq2SeqLM` resolve `model_type="vaswani"`.
"""

from transformers import AutoConfig, AutoModel, AutoModelForSeq2SeqLM

from .configuration_vaswani import PRESETS, VaswaniConfig
from .modeling_vaswani import VaswaniForConditionalGeneration, VaswaniModel, VaswaniPreTrainedModel

__version__ = "0.1.0"

AutoConfig.register(VaswaniConfig.model_type, VaswaniConfig, exist_ok=True)
AutoModel.register(VaswaniConfig, VaswaniModel, exist_ok=True)
AutoModelForSeq2SeqLM.register(VaswaniConfig, VaswaniForConditionalGeneration, exist_ok=True)
# save_pretrained then writes `auto_map` and copies the model code beside the weights, so a checkpoint loads with
# stock transformers and trust_remote_code=True where vaswani_mt is not installed.
VaswaniConfig.register_for_auto_class()
VaswaniModel.register_for_auto_class("AutoModel")
VaswaniForConditionalGeneration.register_for_auto_class("AutoModelForSeq2SeqLM")

__all__ = [
    "PRESETS",
    "VaswaniConfig",
    "VaswaniForConditionalGeneration",
    "VaswaniModel",
    "VaswaniPreTrainedModel",
]
