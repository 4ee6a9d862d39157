"""Federation: an edge coordinator that trains its own crowd and syncs with an upstream."""
