"""Choosing a token on the device: the seeded draw over sorted candidates (draw.py), beside its torch reference."""
