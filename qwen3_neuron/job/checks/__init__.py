"""The plan's checks of a built `Trainer.Config`, the ones torchtitan lacks: `layout` (parallel
degrees against the world size and the model), `static_shapes` (what Neuron's compile needs),
`memory` (the tensor memory per rank) and `torchtitan_api` (the installed torchtitan has the
APIs the project uses, checked before they are imported).
"""
