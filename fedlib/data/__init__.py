"""Data: dataset registry and loaders, client partitions, frozen-backbone features, digit domains."""
