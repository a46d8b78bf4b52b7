"""Showing a run to others: the model card (`model_card` + its Jinja template), the Hub push (`hub`), plots (`plots`).
Reads the run record; writes nothing a run depends on."""
