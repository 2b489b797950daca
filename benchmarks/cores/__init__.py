"""Cores per GPU: Zephon's tokens per CPU-second with a locally trained 128k-vocabulary BPE (bpe.py, measure.py)."""
