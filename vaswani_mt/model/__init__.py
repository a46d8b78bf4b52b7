"""The model. `configuration_vaswani.py` and `modeling_vaswani.py` travel with every saved checkpoint, and
`pipeline_vaswani.py` with every final model, so a folder loads with stock transformers and trust_remote_code=True;
these import only torch, transformers and each other, and use only transformers' public modeling contract.
`fast_decoding.py` (vaswani_mt's decoding loops) and `convert.py` (Marian weights) stay home."""
