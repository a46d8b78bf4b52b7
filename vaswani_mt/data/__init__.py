"""Data: reading parallel corpora (`reading`), cleaning them (`cleaning`), the joint BPE tokenizer (`tokenization`),
tokenising a corpus (`tokenizing`), preparing a corpus once into memory-mapped Arrow files that every run, resume
and process shares (`prepared`), token-budget batches (`batching`)."""
