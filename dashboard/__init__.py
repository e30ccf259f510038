"""The Streamlit dashboard: plans, hardware rooflines, history across boxes, calibration.

``headroom dashboard`` runs `dashboard/app.py`. Pages live in
`dashboard/views/` (not `pages/`, which Streamlit would list as a second navigation); what they compute lives in importable modules that tests
call directly: `data` (cached read-only queries), `planning`, `history`,
`calibration`, `charts` (Altair chart builders) and `columns` (how tables show
their columns). Never imports torch.
"""
