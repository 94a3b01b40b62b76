#!/usr/bin/env python
"""Log in to the test project's admin and make requests, as a browser would, in this process.

``python admin_client.py USERNAME PASSWORD < requests.json`` with the project's settings
(``DURABLE_SITE_DATABASE_URL`` …): posts the login form, then makes each request of the JSON
list (``{"method": "get"|"post", "path": "/admin/…", "data": {…}}``) with Django's test client
and prints one JSON list of ``{"status", "location", "text"}``. Nothing is mocked: sessions,
users and the journal are those of the project's database (tests/contrib/test_django_mysql.py).
"""

import json
import os
import sys


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "durable_site.settings")
    import django

    django.setup()
    from django.test import Client

    username, password = sys.argv[1:3]
    client = Client()
    login = client.post("/admin/login/?next=/admin/", {"username": username, "password": password})
    if login.status_code != 302:
        sys.exit(f"login refused (status {login.status_code})")
    answers = []
    for request in json.load(sys.stdin):
        call = client.post if request["method"] == "post" else client.get
        response = call(request["path"], request.get("data") or {})
        answers.append(
            {
                "status": response.status_code,
                "location": response.get("Location"),
                "text": response.content.decode(),
            }
        )
    json.dump(answers, sys.stdout)


if __name__ == "__main__":
    main()
