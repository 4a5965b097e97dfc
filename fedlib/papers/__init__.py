"""One module per paper: ``afl`` (Analytic Federated Learning), ``stsa`` (STSA / STSA-E),
``fedtsne`` (FedDL, Fed-tSNE, Fed-UMAP, Fed-SpeClust), ``refed`` (Re-Fed replay)."""
