"""The reasoning-gym benchmark: questions drawn from the generators of the reasoning-gym package."""
