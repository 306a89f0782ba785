"""The operator console: pages and JSON routes under /api/console, served by the app itself.

Modules: `security` (who may use it, CSRF), `queries` (what pages show), `job_archive` (a job's
archived entries), `actions` (what operators change), `pages`, `charts` and `assets` (HTML, SVG,
CSS, script), `routes` (dispatch; function_app.py's one import of the console). The overview's
counters are `shared.observability.overview_counters` (the runtime installs them).
"""
