"""Data: reading and cleaning parallel corpora (`corpus`), the joint BPE tokenizer (`tokenization`), token-budget
batches (`batching`). Imports only the model layer's constants, if anything."""
