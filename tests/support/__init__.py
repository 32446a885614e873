"""Test support: a reward with a gradient even for the random `tiny` model."""
