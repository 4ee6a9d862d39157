"""crowdgrad protocol package."""
