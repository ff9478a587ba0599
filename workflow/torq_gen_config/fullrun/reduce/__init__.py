"""``run --reduce``: a failing run reduced to the smallest subgraph that fails the same
way: search (the reduction), values (the reference run's values that feed candidates),
reproducer (the ``reduced/`` folder handed on)."""
