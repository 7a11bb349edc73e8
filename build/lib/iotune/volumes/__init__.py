"""Building test volumes (scratch loop drives, filesystems), always torn down."""
