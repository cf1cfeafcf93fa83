"""Rolling-window detectors: one module per detector, a registry of them, and the one detection pass that runs them."""
