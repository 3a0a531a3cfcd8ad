"""The papers: their published tables and figures beside our numbers (``evalsuite paper``), and their long-context
claims tested here.

``format`` states the rules of the data files (``papers/data/<paper>.yaml``, docs/paper-tables.md) and
``published`` loads them through those rules; ``numbers`` reads printed numbers and prints ours in the paper's
format; ``recipes`` says which task produces each column and computes the columns that come from model cards
(parameters, FLOPs, architecture switches; ``params`` by component); ``run`` runs what a table needs through the
task runner; ``found`` finds our values in run directories; ``layout`` and ``render`` write tables in the paper's
layout (Markdown, LaTeX, CSV); ``figures`` draws the figures; ``listing`` is ``evalsuite paper list``; ``claims`` is
the long-context claims report (``papers/data/claims.yaml``).
"""
