"""What a mapping costs on a design: off-chip traffic, the on-chip buffer's accesses, the
spatial mapping of each Einsum, latency, energy, area and DRAM capacity. It answers "what
does this mapping cost"; it never chooses a mapping (that is :mod:`mambalaya.search`)."""
