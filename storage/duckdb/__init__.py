"""The embedded backend: one DuckDB file, one writer thread, and every storage port over them."""
