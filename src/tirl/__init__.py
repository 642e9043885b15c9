"""tirl: train and evaluate language models that reason with a Python interpreter."""

__version__ = "0.1.0"
