"""The Streamlit dashboard: renders what ``stepscope.analysis`` computes, nothing more.

``app.py`` is the entry point (``stepscope dashboard --store DIR`` runs it); ``views/`` holds
one script per page (not ``pages/``: see ``app.PAGES``); ``_data`` is the cached door to the analyses, ``_filters`` the shared
sidebar, ``_view`` the rendering helpers.
"""
