"""``python -m producer.gateway``: the program, and so the host that decides how records render
(the gateway's modules never configure logging; ``rerankq serve`` passes its own)."""

import logging
import sys

from producer.gateway.main import main


def _stdlib_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)
    if logging.getLevelName(level) != logging.DEBUG:
        # The library logs every stream it opens at INFO: behind the gateway, a line per request.
        logging.getLogger("rerankq.producer").setLevel(logging.WARNING)


raise SystemExit(main(host_logging=_stdlib_logging))
