"""The hybrid families composed of the blocks: Bamba, Jamba and Granite 4, Nemotron-H,
Falcon-H1, Zamba2 and OLMo-Hybrid, and the dispatch of a config.json to its family."""
