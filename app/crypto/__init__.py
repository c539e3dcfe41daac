"""dm-crypt-compatible crypto: cipher specs, IV generators, per-unit and bulk transforms, keys.

Owns byte compatibility with Linux dm-crypt. Imports neither fastapi nor sqlalchemy,
and nothing from the packages above it (api, dm, blk, engine).
"""
