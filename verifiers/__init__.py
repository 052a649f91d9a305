"""Verifier plugins and the protocol they share. Plain Python: no Ray, no torch."""
