"""Pure loss/advantage functions, the staleness-aware GRPO trainer and weight sync."""
