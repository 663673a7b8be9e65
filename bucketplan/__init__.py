"""The application layer above planner/ (torch-free) and fxglue/ (torch): the command line.

``bucketplan.cli`` builds the parser and dispatches; each command is one module there. planner
and fxglue never import this package (tests/test_layers.py checks it). Nothing is imported at
the top, so that ``python -m bucketplan`` catches a Ctrl-C while the libraries load.
"""
