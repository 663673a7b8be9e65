"""The types every room shares: problem and plan, their files, the policy, search options, positions.

``problem`` (Problem, Plan and their parts), ``io`` (JSON files, gzipped or not, written
atomically), ``policy`` (which overlap a plan keeps, its memory budgets), ``options`` and
``arguments`` (a search's settings, each checked once), ``positions`` (where a bucket's merged
start and wait sit). Imports nothing of the other rooms.
"""
