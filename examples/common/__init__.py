"""Code the examples share: the training/check loop, the decoder-only transformer, text data and generation."""
