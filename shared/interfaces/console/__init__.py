"""The operator console: pages and JSON routes under /api/console, served by the app itself.

Modules: `metrics` (overview counters), `security` (who may use it, CSRF), `queries` (what pages
show), `actions` (what operators change), `pages` and `assets` (HTML, CSS, script), `routes`
(dispatch). Only `metrics` is imported by the rest of the app (the runtime installs it).
"""
