"""The scaling policies, one module each; `plan.registry` lists them by name."""
