"""The layer blocks, each a cascade of extended Einsums: Mamba-1, Mamba-2, attention, the
MLP, mixture-of-experts and Gated DeltaNet (and the attention masks)."""
