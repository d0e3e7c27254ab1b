"""canifinetune's pure core: model specs, catalogs, the memory model, the verdict and the search.

Nothing here imports torch or touches the network.
"""
