"""What differs between the PJRT clients tpu tensors run on (docs/architecture.md, "The platform boundary")."""
