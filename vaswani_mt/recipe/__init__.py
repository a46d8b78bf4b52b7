"""The paper's training recipe: the run config (`config`), Adam + Noam schedule (`schedule`), label-smoothed loss
(`loss`), the Seq2SeqTrainer that wires them in (`trainer`), checkpoint averaging (`averaging`)."""
