"""Parity models (ParM, Kosaian et al., SOSP 2019): erasure-coded resilience for a deployed model.

``coding`` holds the pure encoder and decoder (numpy only: what the gateway calls per coding
group), ``training`` trains a parity model for a deployed variant, ``artifacts`` exports it and
its metadata (cached), ``evaluation`` measures accuracy with and without reconstruction.
"""
