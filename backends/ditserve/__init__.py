"""Serve diffusion transformers on Triton with step-wise continuous batching.

Imports flow one way: deployment/schema -> engine -> adapters; the Triton shims in
`ditserve.triton` and the client in `ditserve.client` sit on top.
"""
