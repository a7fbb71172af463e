"""Model implementations (one file per architecture)."""
