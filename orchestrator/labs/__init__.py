"""Lab tools that are not serving trials: roofline calculator, KV-capacity worksheet,
and the HF static-batching baseline of weeks 4 and 7."""
