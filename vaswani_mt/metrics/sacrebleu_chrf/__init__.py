"""The ``evaluate`` metric module ``sacrebleu_chrf`` (load it with :func:`vaswani_mt.metrics.load_metric`).

This folder is laid out the way ``evaluate.load(<folder>)`` expects: the script has the
folder's name. The ``__init__`` only makes the folder a regular package, so it ships in the
wheel and :mod:`vaswani_mt.metrics` can import ``corpus_scoring`` directly (its ``corpus_scores`` is the
package's).
"""
