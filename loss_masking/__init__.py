"""Chat-template token deltas, loss masks, truncation records and packing (issue #6)."""
