"""The XLA CPU client's own machinery: the host tier, background compiles and the compile worker."""
