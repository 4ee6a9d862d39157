"""crowdgrad coordinator package."""
