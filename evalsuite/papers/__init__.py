"""The four seed papers' tables and figures beside our numbers (``evalsuite paper``).

``published`` reads the transcribed tables (``papers/data/<paper>.yaml``, format in docs/paper-tables.md) and
parses printed numbers; ``numbers`` keeps the paper's number formats; ``recipes`` says which task produces each
column and computes the columns that come from model cards (parameters, FLOPs, architecture flags); ``run`` runs
what a table needs through the task runner; ``found`` finds our values in run directories; ``layout`` and
``render`` write tables in the paper's layout (Markdown, LaTeX, CSV); ``figures`` draws the figures; ``listing``
is ``evalsuite paper list``.
"""
