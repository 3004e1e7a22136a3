"""The operator's web page, served by the API service at ``/`` (issue 13).

Same process, port and bearer tokens as the JSON API: :func:`mount` adds the page's routes
to the API's application. Every asset ships in this package (``static/``); nothing is
fetched from the network and there is no build step. The page is a small vanilla-JS front
end (``static/app.js``) that calls the JSON API (``/v1/...``) and the few page-only routes
below, with the bearer token kept in the tab's ``sessionStorage`` and sent in the
``Authorization`` header (never in a URL).

Routes (``/ui/api/*`` need the bearer token, as ``/v1`` does):

* ``GET /`` the page; ``GET /ui/static/{name}`` its script and style sheet;
* ``GET /ui/api/me`` the actor the token maps to;
* ``GET /ui/api/jobs?state=&cluster=&needs=person&offset=&limit=`` one page of the jobs
  list, with cluster, name, epoch, age and open escalations per row, and the total;
* ``GET /ui/api/inbox?job=`` open escalations (and held jobs) with meanings and answers;
  with ``job``, also the ``commands`` that can apply to that job now (the core's
  ``job_commands``);
* ``GET /ui/api/changes`` SSE of every job's Status head as it changes (the live list);
* ``POST /ui/api/preview`` a job file (TOML or JSON) -> the body ``POST /v1/jobs`` takes and
  the plan it would get (uncovered causes, substitutions), without submitting.
"""

from __future__ import annotations

from services.api.web.handlers import mount

__all__ = ["mount"]
