"""Showing a run to others: the model card (`model_card` + its Jinja template), a recipe's seeds beside it (`seeds`),
the Hub push (`hub`), and the code saved beside models brought up to date (`model_code`). Reads the run record; writes
nothing a run depends on."""
