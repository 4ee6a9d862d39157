"""crowdgrad storage package."""
