"""Operations: benchmarks (``ops.bench``), the chaos run (``python -m ops.chaos``), the
evaluation collection's builder, deployment configuration. Run from the repository root."""
