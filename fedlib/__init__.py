"""fedlib: the compact library behind the federated-learning compendium.

Every algorithm of the book lives here; notebooks only call it.

Packages
--------
core        messages and their measured costs, the one client/server protocol and its in-process
            simulator, argument checks, seeds (SeedSequence), devices, float64 linear algebra
            (sufficient statistics, ridge solves), per-sample gradients, privacy accounting
data        dataset registry and loaders, client partitions, frozen-backbone features, digit domains
federated   gradient-based federated methods on the protocol, models, the class-incremental protocol
            and the gradient-based incremental learner with pluggable replay
papers      one module per paper: afl, stsa, fedtsne, refed
evaluation  accuracy and embedding metrics, statistics and reporting, the claims ledger, the papers'
            printed tables (one module per paper)
bench       benchmarks on one shared harness
runner      profiles, typed parameter specifications, the notebook runner, the book's Sphinx extension,
            repository paths
"""

__version__ = "0.1.0"
