"""fedlib: the compact library behind the federated-learning compendium.

Every algorithm of the book lives here; notebooks only call it.

Modules
-------
data        dataset registry with real loaders (offline: Fashion-MNIST, MNIST-5k, optdigits, Animal-MNIST)
partition   IID / Dirichlet / shards / one-class-per-client client partitions, reports and heat maps
features    frozen pretrained backbones and the on-disk feature cache
messages    explicit client/server messages whose byte size is measured
federated   one federated training loop for every gradient-based method (FedAvg, FedProx, ...)
models      from-scratch image networks (SmallResNet, CIFAR ResNet-18, SmallCNN), embed, FedAvg backbone
analytic    sufficient statistics (X^T X, X^T Y) in float64 and ridge solves, shared by analytic methods
afl         Analytic Federated Learning (Zhuang et al., 2024): AA law, RI process
incremental the federated class-incremental protocol (tasks, per-task partitions, A_t / A_T / F_T)
stsa        STSA / STSA-E (Guan et al.): random features, statistics aggregation, Gram estimate
fcil        gradient baselines for class-incremental learning (Finetune, FedEWC, FedLwF)
fedtsne     FedDL landmarks, Nystrom distances / kernels, Fed-tSNE, Fed-UMAP, Fed-SpeClust, "+" noise
privacy     Gaussian-mechanism accounting (dp-accounting: PLD / RDP composition, analytic Gaussian)
embedding_metrics  CA@k, NPA@k, NMI / silhouette after k-means, ARI
domains     digit domains built offline (stand-ins for Digit-10) and the domain-incremental stream
refed       Re-Fed (Li et al., 2024): PIM, gradient-norm importance, replay caches; replay baselines
paper_results  the papers' own tables, transcribed, to show beside ours
stats       sample std and paired differences with t confidence intervals (one convention for the book)
claims      the claims ledger: chapters register each paper's headline claims with our verdict
book        Sphinx extension: refuses executed notebooks with errors, writes the claims ledger page
profiles    smoke / quick / paper parameter profiles and the notebook runner
bench       benchmark scripts (speed ratios measured in one process)
utils       devices, seeds, argument checks
"""

__version__ = "0.1.0"
