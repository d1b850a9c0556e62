"""The HTTP side: the Starlette routes, tokens and Origin, admission, the pages and their
static files, the ``/v1/stats`` feed and ``/metrics``. Imports the session layer and below."""
