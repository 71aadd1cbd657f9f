"""Strata: mixture-of-experts GGUF inference in Python, on PyTorch and Triton."""

__version__ = "0.1.0"


def __getattr__(name):
    # The API object pulls in torch; import it only when asked so `strata --help` stays quick.
    if name == "LLM":
        from strata.api import LLM

        return LLM
    raise AttributeError(name)
