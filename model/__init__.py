"""What every layer agrees on: the canonical columns, the rules that derive and split them, and thread names.

The ground floor: collector, storage, detectors and the service import it, and it imports none of them, so
a column's definition has one home whichever side of the store reads it (tests/test_layering.py).
"""
