"""The model: what travels with every saved checkpoint (configuration, modeling, generation, pipeline code), so a
folder loads with stock transformers and trust_remote_code=True. These files import only torch, transformers and each
other; `convert.py` (Marian weights) stays home."""
