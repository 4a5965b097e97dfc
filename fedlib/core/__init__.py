"""Shared core: messages and costs, the client/server protocol and its simulator, argument checks,
seeds, devices, float64 linear algebra, per-sample gradients, privacy accounting."""
