"""Scorers: deterministic answer matching (``match``) and the OpenAI-compatible LLM judge (``judge``)."""
