"""crowdgrad simulations package."""
