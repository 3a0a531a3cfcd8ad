"""The papers: their published tables and figures, and their long-context claims tested here."""
