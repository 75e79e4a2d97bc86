"""The transformers side: reading config.json files (typed getters, field audits and the
types transformers checks) and loading checkpoint weights into each block's tensors."""
