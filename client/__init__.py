"""crowdgrad client package."""
