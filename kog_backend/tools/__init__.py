"""The `kog` command and what it uses: benchmarks, doctor, and the fixtures (real model shapes, the built
tokenizer, random-weight checkpoints)."""
