"""Pure decisions: no torch, horovod, subprocess or clock (tests/test_layers.py enforces it)."""
