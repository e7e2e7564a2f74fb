"""The Hydra matrix application (`python -m matrix`) and its review commands."""
