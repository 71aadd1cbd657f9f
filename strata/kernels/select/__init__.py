"""QSA selection: indexer block keys and scores, top-k cells per query (torch references and Triton kernels)."""
