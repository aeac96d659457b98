"""sa_lightning: Stochastic Attention experiments with PyTorch Lightning."""

__version__ = "0.1.0"
