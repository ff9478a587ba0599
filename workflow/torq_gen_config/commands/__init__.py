"""The commands as functions below the command line: what ``torq-gen-config run`` does
(:mod:`.run`: run the assignment, reduce a failing run) and the names of a run's outputs
(:mod:`.outputs`), for the CLI, ``discover`` (the full-subgraph test) and any tool or
notebook that drives the product without parsing arguments."""
