"""Stand-in for `src/transformers/__init__.py` of transformers' repository, which `tests/test_pipeline_mixin.py`
imports through `direct_transformers_import`: running this empty file hands back the installed transformers."""
