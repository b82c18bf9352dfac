"""Rewrites on partir IR: inlining, the equivalence registry, tiling, propagation."""
