"""The bench: every available backend on the same inputs (`run`), latency (`latency`), and the report as a table,
JSON, Markdown, CSV and a plot (`report`).

Goes through `ensure` for what it needs made; imports every layer below it, never cli or deploy.
"""
