"""Federated and incremental machinery shared by the papers: gradient-based methods on the
protocol (FedAvg, FedProx, FedDyn, FedNTD, MOON, FedDisco), models, the class-incremental
protocol and the gradient-based incremental learner (FedEWC, FedLwF, replay)."""
