"""Cost models: off-chip traffic and on-chip footprint of mappings, and the searches over them."""
