"""Renderers: pure functions from analysis results to text (terminal, Markdown, JSON, JUnit XML,
HTML). They do no I/O and compute no figure; the commands decide where the text goes."""
