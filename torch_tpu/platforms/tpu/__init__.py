"""TPU's own facts: Mosaic's block rules (mosaic.py) and libtpu's runtime metrics (monitoring.py)."""
