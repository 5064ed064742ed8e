"""A module that logs while it is imported (``--app tests.cli.logging_app:none``): how the
command shows log records of each level."""

import logging

logging.getLogger("nestegg.test").warning("a warning of nestegg")
logging.getLogger("nestegg.test").error("an error of nestegg")
logging.getLogger("nestegg.test").warning("a driver's message:\n\tover two lines")
try:
    raise KeyError("lost")
except KeyError:
    logging.getLogger("nestegg.test").exception("a failure of nestegg")
logging.getLogger("somelib").warning("a warning of another library")
logging.getLogger("somelib").critical("a critical record of another library")
logging.getLogger("aiormq.connection").error("error when creating transport: a broker client")
logging.getLogger("psycopg.pool").error("a store client's error")
