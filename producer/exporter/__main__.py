"""``python -m producer.exporter``: the program, and so the host that decides how records render
(the exporter's modules never configure logging; ``rerankq exporter`` passes its own)."""

import logging
import sys

from producer.exporter.main import main


def _stdlib_logging(level: str) -> None:
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s %(message)s", stream=sys.stderr)


raise SystemExit(main(host_logging=_stdlib_logging))
