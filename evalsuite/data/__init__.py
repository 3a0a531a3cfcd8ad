"""Document sources: user corpora on disk and the built-in synthetic corpus."""
