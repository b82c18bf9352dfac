"""xDSL dialects of partir: the core loop dialect, StableHLO's gaps, CHLO."""
