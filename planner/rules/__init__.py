"""The rules a plan must keep, read independently of every model: ``verifier``.

It imports only the types, positions and the memory count, never a search model, so a modelling
bug cannot certify itself.
"""
