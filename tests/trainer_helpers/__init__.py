"""Helpers for tests/test_trainer.py: tiny deterministic trainer setups shared by the in-process tests and the
multi-process script `ddp_checks.py` (run under torchrun)."""
