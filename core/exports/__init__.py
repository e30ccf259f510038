"""One module per training framework that ``headroom plan --export`` writes settings for.

`core.export` is the entry point (``export``, ``EXPORTERS``); `core.exports.run`
holds what every writer shares: the plan reduced to a `Run`, and the `Export`
each writer returns.
"""
